"""The demo chain end to end on a tiny model: every step runs through the real
entry point and leaves the files a colleague re-reads (L5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "task",
    # the extraction chain is also covered end to end by test_extraction_guards_tiny_lm and
    # test_verify; its whole demo (40 s) runs in the slow tier
    ["classification", pytest.param("extraction", marks=pytest.mark.slow)],
)
def test_l5_quick_demo_runs_the_whole_chain_and_delivers(tmp_path: Path, task: str):
    folder = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "tunepilot.cli", "demo", str(folder), "--quick", "--task", task],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode in (0, 1), result.stderr[-3000:]
    out = result.stdout
    for step in ("data audit", "baseline", "pilot", "plan", "sweep", "compare", "report",
                 "summary"):
        assert step in out, step
    summary = out[out.index("summary"):]
    assert "5. dossier:" in summary and "decision:" in summary
    assert "run 1 of " in out  # the sweep says which run it is on, and of how many
    assert "run 1 of " in result.stderr.split("training control-s0-1")[0].splitlines()[-1]
    assert (folder / "report" / "index.html").is_file()
    gates = json.loads(next((folder / "pilots").glob("*/gates.json")).read_text())
    assert len(gates["rows"]) == 13
    exports = folder / "exports"
    bundles = [p for p in exports.iterdir() if p.is_dir()] if exports.is_dir() else []
    if task == "classification":  # H3: the random head's lucky scores are no reference, so
        # the control's own guards pass and the quick demo delivers a verified bundle
        assert bundles, summary
        report = (folder / "report" / "index.html").read_text(encoding="utf-8")
        assert "head is new" in report and "random head" in report
    if bundles:  # a run whose guards pass was delivered, and it verifies
        (bundle,) = bundles
        assert f"export {bundle.name}" in out and "verify in a new process" in out
        verification = json.loads((exports / f"{bundle.name}.verification.json").read_text())
        assert verification["verdict"] == "PASS"
        delivered = summary[summary.index("4. delivered:"):].replace("\n", "")  # wrapped
        assert bundle.name in delivered
    else:  # nothing passes its guards: the summary says so instead of delivering it (H2)
        assert "4. delivered: nothing" in summary and "fails its guards" in summary
    # exit 1 exactly when a step failed or the dossier lists a FAIL, and the summary says so
    assert (result.returncode == 1) == ("every step passed" not in summary)


def test_demo_refuses_to_overwrite_a_campaign(tmp_path: Path):
    (tmp_path / "campaign.yaml").write_text("name: mine\n")
    result = subprocess.run(
        [sys.executable, "-m", "tunepilot.cli", "demo", str(tmp_path), "--quick"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and "already" in result.stderr
    assert (tmp_path / "campaign.yaml").read_text() == "name: mine\n"


def test_demo_a_step_with_nothing_to_work_on_is_not_counted_as_passed():
    """compare exits 2 when no run is comparable (every one diverged): the summary must not
    then say "every step passed"."""
    from tunepilot.demo.chain import StepLog

    log = StepLog()
    for name, code in (("audit", 0), ("sweep", 1), ("compare", 2), ("report", 0)):
        log.run(name, lambda code=code: code)
    assert log.failed() == ["sweep", "compare"]


def _demo(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunepilot.cli", "demo", str(folder), *args],
                          capture_output=True, text=True, timeout=3600)  # fmt: skip


def _delivered_and_verified(folder: Path, result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-2000:])
    summary = result.stdout[result.stdout.index("summary"):]
    assert "every step passed" in summary
    (record,) = (folder / "exports").glob("*.verification.json")
    assert json.loads(record.read_text())["verdict"] == "PASS"
    return summary


@pytest.mark.slow
def test_l5_image_demo_fails_the_planted_audit_fixes_it_and_delivers(tmp_path: Path):
    """The planted folder's audit must FAIL; the fixed export passes and the chain delivers."""
    folder = tmp_path / "digits"
    result = _demo(folder, "--task", "image", "--quick")
    _delivered_and_verified(folder, result)
    out = result.stdout
    planted = out[out.index("data audit of the planted problems"):out.index("fix what the")]
    assert "FAIL" in planted and "wrote" in out and (folder / "data" / "digits-fixed").is_dir()
    assert "data.file now points there" in out
    assert "file: data/digits-fixed" in (folder / "campaign.yaml").read_text()


@pytest.mark.slow
def test_h2_l5_extraction_demo_answers_in_valid_json_and_delivers(tmp_path: Path):
    """The full extraction demo, as `tunepilot demo DIR --task extraction` runs it: its JSON
    guards pass (H2) and it delivers a bundle that verifies (L5)."""
    folder = tmp_path / "fields"
    _delivered_and_verified(folder, _demo(folder, "--task", "extraction"))
    (bundle,) = [p for p in (folder / "exports").iterdir() if p.is_dir()]
    metrics = json.loads((bundle / "metrics.json").read_text())["metrics"]["final_validation"]
    assert metrics["json_validity"] >= 0.95 and metrics["schema_validity"] >= 0.9
