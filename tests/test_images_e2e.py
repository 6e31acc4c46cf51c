"""An image campaign end to end on CPU (H3, V2, R2, P4, D3, L4): audit -> baseline -> runs ->
compare -> export -> verify in a new process -> the dossier, whose contact sheet a real
headless Chromium renders from an inline data: URI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory):
    from tunepilot.data.flow import audit_workspace
    from tunepilot.data.workspace import Workspace
    from tunepilot.deliver.flow import export_command
    from tunepilot.deliver.verify import verify_command
    from tunepilot.demo.images import write_image_campaign
    from tunepilot.experiments import flow as run_flow
    from tunepilot.experiments.compare import compare_command
    from tunepilot.report.flow import write_report

    ws = Workspace.open(write_image_campaign(tmp_path_factory.mktemp("digits"), quick=True))
    codes = {
        "audit": audit_workspace(ws, as_json=False),
        "baseline": run_flow.baseline(ws, as_json=False),
        "run": run_flow.run(ws, None, None, None, as_json=False),
        "compare": compare_command(ws, as_json=False),
        "export": export_command(ws, "control-s0-1", None, False),
    }
    codes["verify"] = verify_command(ws.exports_dir / "control-s0-1", False)
    path, data = write_report(ws)
    return ws, codes, path, data


def test_r2_an_image_campaign_runs_baseline_to_verify_on_cpu(chain) -> None:
    ws, codes, _, _ = chain
    assert codes["audit"] == 1  # the planted problems FAIL the audit, the chain goes on
    # 12 updates from a random ViT may fail a guard: compare says so (1) and still decides
    assert codes["compare"] in (0, 1) and (ws.root / "comparison.json").is_file()
    assert [codes[k] for k in ("baseline", "run", "verify")] == [0, 0, 0]
    bundle = ws.exports_dir / "control-s0-1"
    # export writes the bundle either way; a run failing a guard is exit 1 and says so (README)
    fails = json.loads((bundle / "metrics.json").read_text())["metrics"]["fails_guards"]
    assert codes["export"] == (1 if fails else 0)
    spec = json.loads((bundle / "bundle.json").read_text())
    assert spec["load"]["auto_class"] == "AutoModelForImageClassification"
    assert (bundle / "preprocessor_config.json").is_file()
    controls = json.loads((bundle / "control.json").read_text())
    assert controls["kind"] == "image_classification" and len(controls["inputs"]) == 8
    verification = json.loads((ws.exports_dir / "control-s0-1.verification.json").read_text())
    replay = next(f for f in verification["findings"] if f["check"] == "control replay")
    assert replay["verdict"] == "PASS"


def test_d3_the_contact_sheet_is_inline_in_the_dossier_and_chromium_draws_it(
    chain, tmp_path: Path
) -> None:
    from test_report_browser import chromium, ink, screenshot

    _, _, path, data = chain
    names = [p["name"] for p in data["data"]["pictures"]]
    assert names == ["contact_sheet.png", "near_duplicates.png"]
    html = path.read_text(encoding="utf-8")
    section = html.split('<section id="data">')[1].split("</section>")[0]
    assert section.count('<img src="data:image/png;base64,') == 2
    assert "<script" not in html
    dom = chromium(tmp_path, "--dump-dom", path.as_uri()).stdout
    assert dom.count('src="data:image/png;base64,') == 2
    bare = tmp_path / "no-figures.html"
    bare.write_text(re.sub(r"<figure>.*?</figure>", "", html, flags=re.S), encoding="utf-8")
    with_sheet = ink(screenshot(tmp_path, path, "with.png", 6000))
    without = ink(screenshot(tmp_path, bare, "without.png", 6000))
    assert with_sheet > without + 10_000, (with_sheet, without)  # the pictures drew pixels


def test_s4_the_pilot_runs_every_gate_on_an_image_campaign(tmp_path: Path) -> None:
    """Memory per phase, update audit, accumulation, overfit, resume in a new process and the
    export replay all run on pixel batches; only the planted data problems FAIL."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.demo.images import write_image_campaign
    from tunepilot.pilot.flow import run_pilot

    ws = Workspace.open(write_image_campaign(tmp_path, quick=True))
    assert run_pilot(ws, as_json=True) == 1
    (folder,) = ws.pilots_dir.iterdir()
    rows = json.loads((folder / "gates.json").read_text())["rows"]
    verdicts = {r["phase"]: r["verdict"] for r in rows}
    assert verdicts.pop("data") == "FAIL"
    assert set(verdicts.values()) == {"PASS"}, verdicts
    assert (folder / "contact_sheet.png").is_file()
    assert all(r.get("memory") for r in rows if r["phase"] != "environment")
