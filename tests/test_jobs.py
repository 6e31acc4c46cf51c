"""`tunepilot run --jobs N`: independent runs side by side, each bit-identical to running it
alone (V2, V6). Slot policy tests are pure; the end-to-end test starts real child processes.

Thread counts: the jobs below run with 1 torch thread each (2 jobs on the 2 cores of this
machine), the reference alone with torch's default (every core). On the tiny models the
losses and gradient norms are bit-identical across thread counts; on large reductions they
need not be (see jobs.py), which is why each job's thread count is written in its log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunepilot.data.workspace import Workspace
from tunepilot.errors import InputError
from tunepilot.experiments.jobs import job_command, job_slots, run_jobs

SHORT = {
    "training.budget.updates": 6, "training.eval_every": 3, "training.microbatch": 2,
    "training.accumulation": 2, "training.warmup_updates": 0, "seeds": [0],
    "variants": {"lr-2e-4": {"explain": "double lr", "overrides": {"training.lr": 2e-4}}},
}  # fmt: skip


def test_v6_cpu_jobs_divide_the_cores_instead_of_oversubscribing_them():
    slots = job_slots(jobs=2, n_runs=4, cpus=2, gpus=[])
    assert [s.env["OMP_NUM_THREADS"] for s in slots] == ["1", "1"]
    assert all(s.env["CUDA_VISIBLE_DEVICES"] == "" for s in slots)
    assert [s.env["OMP_NUM_THREADS"] for s in job_slots(3, 3, 16, [])] == ["5", "5", "5"]
    # One run keeps every core, as it would alone.
    assert [s.env["OMP_NUM_THREADS"] for s in job_slots(4, 1, 8, [])] == ["8"]


def test_v6_gpu_jobs_get_one_device_each_and_never_more_jobs_than_devices():
    slots = job_slots(jobs=4, n_runs=6, cpus=16, gpus=["2", "5"])
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == ["2", "5"]
    assert [s.env["OMP_NUM_THREADS"] for s in slots] == ["8", "8"]


def test_v6_zero_jobs_is_refused():
    with pytest.raises(InputError, match="--jobs"):
        job_slots(jobs=0, n_runs=1, cpus=2, gpus=[])


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tunepilot.demo.campaign import write_demo_campaign

    folder = tmp_path_factory.mktemp("jobs-campaign")
    return write_demo_campaign(folder, tiny=True, n_conversations=40, overrides=SHORT)


def test_v6_a_job_is_an_ordinary_run_of_the_same_campaign_and_overrides(campaign: Path):
    ws = Workspace.open(campaign, ["training.lr=5e-5"])
    cmd = job_command(ws, "lr-2e-4", 3, stop_after=None)
    assert cmd[1:4] == ["-m", "tunepilot.cli", "run"]
    assert cmd[4:] == [str(ws.campaign_file), "training.lr=5e-5", "--variant", "lr-2e-4",
                       "--seeds", "3"]  # fmt: skip


def test_v6_unknown_variant_is_refused_before_any_process_starts(campaign: Path):
    ws = Workspace.open(campaign)
    with pytest.raises(InputError, match="lr-9"):
        run_jobs(ws, ["lr-9"], "0", 2)
    assert not (ws.root / "logs").exists()


def _curve(run_dir: Path, key: str) -> list[float]:
    return [json.loads(x)[key] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_v6_two_jobs_side_by_side_are_bit_identical_to_the_same_runs_alone(campaign: Path):
    import torch

    from tunepilot.experiments import flow as run_flow
    from tunepilot.ledger import Ledger

    ws = Workspace.open(campaign)
    assert run_jobs(ws, ["control", "lr-2e-4"], "0", 2) == 0
    with Ledger.open(ws.ledger_path) as ledger:
        together = {r.variant: r for r in ledger.list_runs()}
    assert {v: r.status for v, r in together.items()} == {
        "control": "completed", "lr-2e-4": "completed"
    }  # fmt: skip
    logs = sorted((ws.root / "logs").glob("jobs-*/*.log"))
    assert [p.name for p in logs] == ["control-s0.log", "lr-2e-4-s0.log"]
    assert "'OMP_NUM_THREADS': '1'" in logs[0].read_text()

    print(f"\nalone with {torch.get_num_threads()} threads, jobs with 1 thread each")
    for variant in ("control", "lr-2e-4"):
        with Ledger.open(ws.ledger_path) as ledger:
            before = {r.id for r in ledger.list_runs()}
        run_flow.run(ws, [variant], "0", None, as_json=True)  # alone, in this process
        with Ledger.open(ws.ledger_path) as ledger:
            (alone,) = [r for r in ledger.list_runs() if r.id not in before]
        for key in ("loss", "grad_norm"):
            assert _curve(ws.runs_dir / alone.id, key) == _curve(
                ws.runs_dir / together[variant].id, key
            ), (variant, key)
    assert _curve(ws.runs_dir / together["control"].id, "loss") != _curve(
        ws.runs_dir / together["lr-2e-4"].id, "loss"
    )
