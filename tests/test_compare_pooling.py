"""What compare may pool (V1, V2, B1): runs under one variant name trained with other settings
(a command-line override) are listed apart with the difference, never counted as a seed; runs
on another backend are not compared with the control's; a variant's `control` can only be the
campaign itself; resume refuses another backend unless told, and `run` says when the
campaign's runs trained elsewhere.

The ledgers hold real run folders: config.resolved.yaml and env.json written by the runner's
own `write_run_files` from the real campaign; a GPU run is a run folder whose env.json is the
fingerprint a CUDA machine records (no GPU here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tunepilot.data.workspace import Workspace
from tunepilot.experiments.compare import compare_ledger
from tunepilot.experiments.runner import run_campaign_for, write_run_files
from tunepilot.ledger import Ledger, Prediction
from tunepilot.tasks.metrics import classification_metrics

LABELS = ["refund", "delivery", "cancel"]
GOLD = [LABELS[i % 3] for i in range(60)]
CAMPAIGN = """
name: pool
hypothesis: {behaviour: route tickets, task: classification}
model: {name_or_path: base}
data: {file: data.jsonl, fields: {label: label}}
variants:
  lr-2e-4: {explain: more lr, overrides: {training.lr: 2.0e-4}}
seeds: [0, 1]
"""
H100 = {"name": "NVIDIA H100 80GB HBM3", "total_memory_bytes": 85_000_000_000,
        "capability": "9.0", "multiprocessors": 132, "bf16_supported": True}  # fmt: skip


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    (tmp_path / "campaign.yaml").write_text(CAMPAIGN, encoding="utf-8")
    return Workspace.open(tmp_path / "campaign.yaml")


def add_run(ws: Workspace, ledger: Ledger, variant: str, seed: int, wrong: int,
            overrides: list[str] | None = None, gpu: bool = False) -> str:  # fmt: skip
    """A completed run with its folder as the runner writes it, `overrides` given on the
    command line of `tunepilot run`, and `wrong` examples missed."""
    launched = Workspace.open(ws.campaign_file, overrides) if overrides else ws
    campaign = run_campaign_for(launched, variant, seed)
    rid = ledger.register_run(campaign="pool", variant=variant, seed=seed,
                              config_hash=campaign.config_hash(), data_version="D1")
    write_run_files(ledger.run_folder(rid), campaign, {"run_id": rid})
    if gpu:  # the fingerprint a CUDA machine writes
        env_file = ledger.run_folder(rid) / "env.json"
        env = json.loads(env_file.read_text())
        env["torch"] = {**env["torch"], "backend": "cuda", "cuda": "12.4"}
        env["devices"] = [{"index": 0, **H100}]
        env_file.write_text(json.dumps(env))
    preds = [LABELS[(LABELS.index(g) + 1) % 3] if i < wrong else g for i, g in enumerate(GOLD)]
    ledger.set_status(rid, "running", "started")
    rows = [Prediction(f"v{i}", g, p, float(g == p), {"id": f"v{i}", "gold": g, "pred": p})
            for i, (g, p) in enumerate(zip(GOLD, preds, strict=True))]  # fmt: skip
    ledger.record_evaluation(rid, "validation", classification_metrics(GOLD, preds, LABELS),
                             eval_config_hash="E1", data_version="D1", update=10,
                             predictions=rows)  # fmt: skip
    ledger.set_status(rid, "completed", "budget reached")
    return rid


def lines(cmp) -> dict:
    return {x.run_id: x for v in cmp.variants for x in v.runs}


def test_v1_v2_a_control_seed_launched_with_another_lr_is_listed_apart_never_pooled(ws):
    with Ledger.open(ws.ledger_path) as ledger:
        good = add_run(ws, ledger, "control", 0, wrong=20)
        odd = add_run(ws, ledger, "control", 1, wrong=5, overrides=["training.lr=0.05"])
        for seed in (0, 1):
            add_run(ws, ledger, "lr-2e-4", seed, wrong=10)
        cmp = compare_ledger(ws.campaign, ledger, resamples=200)
    runs = lines(cmp)
    why = runs[odd].excluded or ""
    assert why.startswith("not pooled") and "training.lr 0.05" in why, why
    assert runs[good].excluded is None
    control = cmp.variants[0]
    assert control.summary["macro_f1"]["values"].keys() == {"0"}  # seed 1 is not a seed of it
    assert cmp.reference["run"] == good
    assert cmp.variants[1].ci["seeds"] == [0]  # paired on the one pooled control seed


def test_v1_v2_runs_launched_as_the_campaign_says_are_all_pooled(ws):
    with Ledger.open(ws.ledger_path) as ledger:
        for seed in (0, 1):
            add_run(ws, ledger, "control", seed, wrong=20)
            add_run(ws, ledger, "lr-2e-4", seed, wrong=10)
        cmp = compare_ledger(ws.campaign, ledger, resamples=200)
    assert all(x.excluded is None for x in lines(cmp).values())
    assert cmp.variants[1].ci["seeds"] == [0, 1]
    assert not [n for n in cmp.notes if "no recorded settings" in n], cmp.notes


def test_b1_a_run_recorded_on_a_gpu_is_not_compared_with_the_cpu_control(ws):
    with Ledger.open(ws.ledger_path) as ledger:
        for seed in (0, 1):
            add_run(ws, ledger, "control", seed, wrong=20)
        cpu = add_run(ws, ledger, "lr-2e-4", 0, wrong=10)
        gpu = add_run(ws, ledger, "lr-2e-4", 1, wrong=2, gpu=True)
        cmp = compare_ledger(ws.campaign, ledger, resamples=200)
    runs = lines(cmp)
    why = runs[gpu].excluded or ""
    assert "ran on cuda: NVIDIA H100 80GB HBM3" in why and "on cpu" in why, why
    assert runs[cpu].excluded is None and cmp.variants[1].ci["seeds"] == [0]


def test_v1_a_variant_naming_another_control_is_refused_at_validate(tmp_path: Path):
    text = CAMPAIGN.replace("overrides: {training.lr: 2.0e-4}}",
                            "overrides: {training.lr: 2.0e-4}, control: does-not-exist}")
    (tmp_path / "campaign.yaml").write_text(text)
    done = subprocess.run([sys.executable, "-m", "tunepilot.cli", "validate",
                           str(tmp_path / "campaign.yaml")], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "variants.lr-2e-4.control" in done.stderr and "does-not-exist" in done.stderr
    same = CAMPAIGN.replace("overrides: {training.lr: 2.0e-4}}",
                            "overrides: {training.lr: 2.0e-4}, control: control}")
    (tmp_path / "campaign.yaml").write_text(same)
    assert Workspace.open(tmp_path / "campaign.yaml").campaign.variants["lr-2e-4"].control


@pytest.mark.slow
def test_b1_resume_on_another_backend_is_refused_unless_allowed_and_run_says_it(tmp_path):
    """A real run stopped after 2 updates, its env.json then made a CUDA machine's: resume
    here exits 2 naming both backends; --allow-backend-change resumes and marks the run."""
    from pilot_support import tiny_campaign

    path = tiny_campaign(tmp_path, **{"training.budget.updates": 4, "seeds": [0]})
    cli = [sys.executable, "-m", "tunepilot.cli"]

    def call(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*cli, *args], capture_output=True, text=True, timeout=600)

    done = call("run", str(path), "--variant", "control", "--stop-after", "2")
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    env = json.loads((run_dir / "env.json").read_text())
    env["torch"]["backend"], env["devices"] = "cuda", [{"index": 0, **H100}]
    (run_dir / "env.json").write_text(json.dumps(env))
    refused = call("resume", run_dir.name, str(path))
    assert refused.returncode == 2, refused.stderr
    assert "cuda: NVIDIA H100 80GB HBM3 -> cpu" in refused.stderr
    assert "--allow-backend-change" in refused.stderr
    allowed = call("resume", run_dir.name, str(path), "--allow-backend-change")
    assert allowed.returncode == 0, allowed.stderr
    marked = json.loads((run_dir / "env.json").read_text())
    assert marked["resumed_on"][0]["torch"]["backend"] == "cpu"
    again = call("run", str(path), "--variant", "control", "--seeds", "1")
    assert "completed runs of this campaign trained elsewhere" in again.stderr


def test_b1_resume_refuses_a_run_recorded_on_another_backend_unless_allowed(ws, tmp_path):
    """The fast half of the slow test above: the rule itself, on a run folder recorded by a
    CUDA machine; a run recorded here resumes without a word."""
    from tunepilot.errors import InputError
    from tunepilot.experiments.recovery import resume_backend

    with Ledger.open(ws.ledger_path) as ledger:
        here = add_run(ws, ledger, "control", 0, wrong=1)
        there = add_run(ws, ledger, "control", 1, wrong=1, gpu=True)
        here_dir, there_dir = ledger.run_folder(here), ledger.run_folder(there)
    assert resume_backend(ws, here, here_dir, allow=False) is None
    with pytest.raises(InputError) as refused:
        resume_backend(ws, there, there_dir, allow=False)
    assert "cuda: NVIDIA H100 80GB HBM3 -> cpu" in str(refused.value)
    note = resume_backend(ws, there, there_dir, allow=True)
    assert note and "ran on both" in note
    from tunepilot.measure.env import backend_of, read_env

    assert backend_of(read_env(there_dir)) == "cuda: NVIDIA H100 80GB HBM3 then cpu"
