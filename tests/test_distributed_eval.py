"""V2, B3, B4: validation shared over data-parallel ranks gives one process's evaluation.

Real `tunepilot run --nproc 2` launches (torchrun, gloo on CPU) on the tiny Llama campaign
with 11 validation examples and batches of 1, so under FSDP one rank evaluates one throw-away
batch to keep the collectives in step; DDP and FSDP against one process at the same examples
per update: the same predictions in the same order, the same procedure hash, the loss to the
float summation order.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SHAPE = ["data.split.validation=0.12", "training.eval_batch_size=1", "training.max_new_tokens=8",
         "training.budget.updates=2", "training.eval_every=2"]  # fmt: skip


def _run(campaign: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tunepilot.cli", "run", str(campaign),
                           "--variant", "control", *SHAPE, *args],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def _evaluation(folder: Path, run_id: str) -> tuple[str, dict, list]:
    db = sqlite3.connect(folder / "tunepilot.db")
    eid, config_hash, metrics = db.execute(
        "select id, eval_config_hash, metrics from evaluations where run_id = ?", (run_id,)
    ).fetchone()
    rows = [(x, json.loads(r)["output"]) for x, r in db.execute(
        "select example_id, row from predictions where evaluation_id = ? order by rowid", (eid,))]
    return config_hash, json.loads(metrics), rows


def test_v2_b3_b4_every_rank_evaluates_its_share_and_the_result_is_one_process_s(tmp_path):
    from tunepilot.demo.campaign import write_demo_campaign

    campaign = write_demo_campaign(tmp_path, "extraction", tiny=True, n_conversations=40,
                                   overrides={"training.lr": 1e-3, "data.max_length": 256})
    _run(campaign, "--nproc", "2", "--strategy", "ddp", "training.accumulation=2")
    _run(campaign, "--nproc", "2", "--strategy", "fsdp", "training.accumulation=2")
    _run(campaign, "training.accumulation=4")
    ddp, fsdp, one = (_evaluation(tmp_path, f"control-s0-{n}") for n in (1, 2, 3))
    assert len(one[2]) == 11
    for shared in (ddp, fsdp):
        assert shared[0] == one[0]  # the same procedure
        assert shared[2] == one[2]  # the same outputs, in the split's order
        assert shared[1]["loss"] == pytest.approx(one[1]["loss"], rel=1e-5)
        # every other metric is computed from the outputs alone: equal, not close
        assert {k: v for k, v in shared[1].items() if k != "loss"} == {
            k: v for k, v in one[1].items() if k != "loss"}
