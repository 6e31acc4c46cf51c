"""Runs end to end on a tiny campaign: ids, folders, ledger lines, resume in a new process
(V1-V3, V5, R1, H3), through the real entry points."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tunepilot.data.workspace import Workspace
from tunepilot.demo.campaign import write_demo_campaign
from tunepilot.experiments import flow as run_flow
from tunepilot.ledger import BASELINE, Ledger

SHORT = {
    "training.budget.updates": 6,
    "training.eval_every": 3,
    "training.microbatch": 2,
    "training.accumulation": 2,
    "training.warmup_updates": 0,
    "seeds": [0],
    "variants": {"lr-2e-4": {"explain": "double lr", "overrides": {"training.lr": 2e-4}}},
}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-campaign")
    return write_demo_campaign(folder, tiny=True, n_conversations=40, overrides=SHORT)


def _losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def test_h3_baseline_keeps_predictions_and_fixes_the_hypothesis(campaign: Path):
    ws = Workspace.open(campaign)
    assert run_flow.baseline(ws, as_json=True) == 0
    with Ledger.open(ws.ledger_path) as ledger:
        evals = ledger.evaluations(run_id=BASELINE)
        assert evals and evals[-1].split == "validation"
        n_val = len(ws.prepare(write=False).splits["validation"])
        assert len(ledger.predictions(evals[-1].id)) == n_val
        assert ledger.hypothesis_history()[0].kind == "original"
    rows = (campaign.parent / "baseline" / "predictions.jsonl").read_text().splitlines()
    assert len(rows) == n_val


def test_v1_v2_each_run_has_an_id_a_folder_and_a_ledger_line(campaign: Path):
    ws = Workspace.open(campaign)
    assert run_flow.run(ws, None, None, None, as_json=True) == 0
    with Ledger.open(ws.ledger_path) as ledger:
        runs = {r.id: r for r in ledger.list_runs()}
    assert {"control-s0-1", "lr-2e-4-s0-1"} <= set(runs)
    variant = runs["lr-2e-4-s0-1"]
    assert variant.status == "completed" and variant.control_run == "control-s0-1"
    assert variant.diff == {"training.lr": [1e-4, 2e-4]}
    for run_id in ("control-s0-1", "lr-2e-4-s0-1"):
        folder = ws.runs_dir / run_id
        for name in ("config.resolved.yaml", "env.json", "metrics.jsonl", "evals.jsonl"):
            assert (folder / name).is_file(), name
        assert len(_losses(folder)) == 6
    assert _losses(ws.runs_dir / "control-s0-1") != _losses(ws.runs_dir / "lr-2e-4-s0-1")


def test_r1_stop_then_resume_in_a_new_process_continues_the_identical_curve(campaign: Path):
    ws = Workspace.open(campaign)
    run_flow.run(ws, ["control"], "0", None, as_json=True)  # uninterrupted reference
    run_flow.run(ws, ["control"], "0", 3, as_json=True)  # paused after 3 updates
    with Ledger.open(ws.ledger_path) as ledger:
        rows = [r for r in ledger.list_runs() if r.variant == "control"]
    reference, paused = rows[-2], rows[-1]
    assert paused.status == "interrupted" and "tunepilot resume" in paused.reason
    result = subprocess.run(
        [sys.executable, "-m", "tunepilot.cli", "resume", paused.id, str(campaign), "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "completed"
    assert _losses(ws.runs_dir / paused.id) == _losses(ws.runs_dir / reference.id)


def test_l4_notes_and_v3_runs_listing_include_every_run(campaign: Path):
    ws = Workspace.open(campaign)
    assert run_flow.note(ws, "lr 2e-4 looks steadier", "control-s0-1") == 0
    with pytest.raises(Exception, match="no-such-run"):
        run_flow.note(ws, "x", "no-such-run")
    with Ledger.open(ws.ledger_path) as ledger:
        assert [n.text for n in ledger.notes()] == ["lr 2e-4 looks steadier"]
        statuses = [r.status for r in ledger.list_runs()]
    assert "completed" in statuses


def test_bad_variant_name_is_refused_with_the_known_ones(campaign: Path):
    from tunepilot.errors import InputError

    ws = Workspace.open(campaign)
    with pytest.raises(InputError, match="lr-2e-4"):
        run_flow.run(ws, ["lr-9"], None, None, as_json=True)


def test_v3_retry_gets_a_new_id_pointing_at_the_original(campaign: Path):
    ws = Workspace.open(campaign)
    run_flow.run(ws, ["lr-2e-4"], "0", 2, as_json=True)  # paused: interrupted, with its reason
    with Ledger.open(ws.ledger_path) as ledger:
        paused = ledger.list_runs()[-1]
    assert run_flow.run_any(ws, None, None, None, as_json=True, retry_of=paused.id) == 0
    with Ledger.open(ws.ledger_path) as ledger:
        rows = {r.id: r for r in ledger.list_runs()}
    retry = next(r for r in rows.values() if r.retry_of == paused.id)
    assert retry.id != paused.id and retry.status == "completed"
    assert rows[paused.id].status == "interrupted"  # the original keeps its line


def test_h1_a_changed_hypothesis_is_refused_until_amended_with_a_reason(campaign: Path):
    from tunepilot.errors import InputError

    edited = campaign.read_text().replace("max_class_drop: 0.05", "max_class_drop: 0.5")
    assert edited != campaign.read_text()
    changed = campaign.parent / "campaign.yaml"
    original = campaign.read_text()
    changed.write_text(edited)
    try:
        ws = Workspace.open(changed)
        with pytest.raises(InputError, match="tunepilot amend"):
            run_flow.run(ws, ["control"], "0", 1, as_json=True)
        with pytest.raises(InputError, match="reason"):
            run_flow.amend(ws, "  ")
        assert run_flow.amend(ws, "classes are noisy; 5 points was stricter than the data") == 0
        with Ledger.open(ws.ledger_path) as ledger:
            kinds = [h.kind for h in ledger.hypothesis_history()]
        assert kinds == ["original", "amendment"]
        run_flow.check_hypothesis_before(ws)  # consistent again
    finally:
        changed.write_text(original)


def test_b2_a_single_process_run_builds_its_model_on_the_training_device_gpu_mocked_by_meta(
    campaign: Path, monkeypatch: pytest.MonkeyPatch
):
    """A run with one process trains where `train_device()` says (the first GPU when there is
    one): the model is built there, not left on the host. No GPU here, so the device that
    `train_device` names is mocked by the meta device, which `.to()` reaches the same way."""
    from tunepilot.experiments import runner

    session = runner.Session(Workspace.open(campaign))
    on_host = session.build_model(session.ws.campaign, 0)
    assert {p.device.type for p in on_host.parameters()} == {"cpu"}
    monkeypatch.setattr(runner, "train_device", lambda: "meta")
    placed = session.build_model(session.ws.campaign, 0)
    assert {p.device.type for p in placed.parameters()} == {"meta"}
