"""One rule for outcomes (README, exit codes): 0 passed or warned, 1 a check failed, 2 bad
input, 3 tunepilot itself failed. Real runs on a tiny BERT (slow tier: about a minute on two
loaded cores), the real CLI entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_sweep import write_sweep_campaign
from tunepilot.data.workspace import Workspace

TUNEPILOT = [sys.executable, "-m", "tunepilot.cli"]


@pytest.mark.slow
def test_v3_run_exits_1_when_a_run_diverged_and_0_when_it_completed(
    tmp_path: Path, tiny_bert_dir: Path
):
    from tunepilot.experiments import flow

    ws = Workspace.open(write_sweep_campaign(tmp_path / "c", tiny_bert_dir, n=45))
    assert flow.run(ws, ["lr-huge"], "0", None, as_json=False) == 1  # diverged: a failed check
    assert flow.run(ws, ["control"], "0", 2, as_json=False) == 0  # paused as asked
    assert flow.resume(ws, "control-s0-1", None, as_json=False) == 0  # completed


@pytest.mark.slow
def test_h2_export_of_a_run_that_fails_its_guards_warns_in_output_and_bundle(
    tmp_path: Path, tiny_bert_dir: Path, capsys
):
    from tunepilot.deliver.flow import export_command
    from tunepilot.experiments import flow

    path = write_sweep_campaign(tmp_path / "c", tiny_bert_dir, n=45)
    text = path.read_text(encoding="utf-8").replace(
        "hypothesis: {behaviour: route tickets, task: classification}",
        "hypothesis: {behaviour: route tickets, task: classification,"
        " classification_guards: {per_class_floor: 1.0}}")  # a floor 12 updates cannot reach
    path.write_text(text, encoding="utf-8")
    ws = Workspace.open(path)
    assert flow.run(ws, ["control"], "0", None, as_json=False) == 0
    capsys.readouterr()
    assert export_command(ws, "control-s0-1", None, as_json=True) == 1
    out = capsys.readouterr()
    payload = json.loads(out.out)
    assert payload["fails_guards"] and "floor 1.00" in " ".join(payload["fails_guards"])
    assert "fails its guards" in out.err
    bundle = ws.exports_dir / "control-s0-1"
    readme = (bundle / "README.md").read_text(encoding="utf-8")
    assert "Warning: this run fails its guards" in readme
    saved = json.loads((bundle / "metrics.json").read_text(encoding="utf-8"))["metrics"]
    assert saved["fails_guards"] == payload["fails_guards"]
    assert any(g["verdict"] == "FAIL" for g in saved["guards"])


def test_r4_an_unexpected_error_is_one_sentence_and_a_traceback_file_exit_3(tmp_path: Path):
    """The last-resort handler: a fault inside a command never shows a traceback."""
    code = (
        "import sys\n"
        "from tunepilot.cli import app\n"
        "import tunepilot.campaign.loading as loading\n"
        "def broken(*a, **k):\n    raise ZeroDivisionError('planted')\n"
        "loading.Campaign.model_validate = broken\n"
        "app(['validate', sys.argv[1], '--json'])\n"
    )
    (tmp_path / "campaign.yaml").write_text("name: x\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "campaign.yaml")],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr and "ZeroDivisionError: planted" in result.stderr
    payload = json.loads(result.stdout)
    saved = Path(payload["traceback_file"]).read_text(encoding="utf-8")
    assert "Traceback" in saved and "planted" in saved
    Path(payload["traceback_file"]).unlink()
