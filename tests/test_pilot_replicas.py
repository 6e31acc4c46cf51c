"""S4, S5, B3, B4: a DDP or FSDP campaign's pilot runs its step gates again in real torchrun
processes (2 gloo ranks on CPU), one memory row per rank per phase, and judges what
replication must keep (the same first-step loss, identical DDP replicas).

The real launch is the slow tier (a whole pilot, then two ranks each loading the model); the
judgement of the ranks' reports and the gate list are fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pilot_support import one_torch_thread, tiny_campaign  # noqa: F401  (autouse fixture)
from tunepilot.verdict import Verdict

PHASES = ["load", "first step", "steady step", "evaluation", "checkpoint"]


def _report(rank: int, loss: float = 1.5, digest: str = "d", verdict: str = "PASS") -> dict:
    rows = [{"number": i, "phase": p, "inputs": {"world_size": 2}, "duration_s": 0.1,
             "verdict": verdict if p == "steady step" else "PASS", "sentence": "ran",
             "requirement": "S4", "memory": {"readings": [{"counter": "rss",
                                                            "peak_bytes": 100 + rank}]},
             "details": {"loss": loss} if p == "first step" else {}}
            for i, p in enumerate(PHASES)]  # fmt: skip
    return {"rank": rank, "backend": "gloo", "device": "cpu", "trainable_sha256": digest,
            "rows": rows}


def test_b3_s5_replicas_are_judged_on_every_rank_the_same_loss_and_identical_weights() -> None:
    from tunepilot.pilot.replicas import _judge

    good = _judge([_report(0), _report(1)], "ddp", 2, 1.0)
    assert good.verdict is Verdict.PASS
    assert [(r["rank"], r["phase"]) for r in good.details["rows"]] == [
        (k, p) for k in (0, 1) for p in PHASES]  # fmt: skip
    assert "identical trainable weights" in good.sentence
    drift = _judge([_report(0), _report(1, digest="other")], "ddp", 2, 1.0)
    assert drift.verdict is Verdict.FAIL and "gradients are not synchronised" in drift.sentence
    assert _judge([_report(0), _report(1, digest="other")], "fsdp", 2, 1.0).verdict is (
        Verdict.PASS)  # a shard per rank  # fmt: skip
    apart = _judge([_report(0), _report(1, loss=1.6)], "ddp", 2, 1.0)
    assert apart.verdict is Verdict.FAIL and "different first-step losses" in apart.sentence
    failed = _judge([_report(0), _report(1, verdict="FAIL")], "ddp", 2, 1.0)
    assert failed.verdict is Verdict.FAIL and "rank 1 steady step" in failed.sentence


def test_s4_the_replicas_gate_is_in_the_pilot_of_a_ddp_or_fsdp_campaign_only() -> None:
    from tunepilot.campaign import Campaign
    from tunepilot.pilot.flow import GATES, gates_for

    def campaign(strategy: str, nproc: int) -> Campaign:
        return Campaign.model_validate({
            "name": "c", "hypothesis": {"behaviour": "b", "task": "classification"},
            "model": {"name_or_path": "m"}, "data": {"file": "d", "fields": {"label": "l"}},
            "training": {"distributed": {"strategy": strategy, "nproc": nproc}}})  # fmt: skip

    assert gates_for(campaign("none", 1)) == GATES and len(GATES) == 13
    for strategy in ("ddp", "fsdp"):
        names = [g.name for g in gates_for(campaign(strategy, 2))]
        assert len(names) == 14 and names[-1] == "replicas"
    assert gates_for(campaign("ddp", 1)) == GATES  # one process: nothing to replicate


@pytest.mark.slow
def test_s4_s5_b3_a_two_rank_ddp_pilot_writes_one_memory_row_per_rank_per_phase(
    tmp_path: Path,
) -> None:
    from tunepilot.data.workspace import Workspace
    from tunepilot.pilot.flow import execute_pilot
    from tunepilot.report.collect import collect
    from tunepilot.report.sections import pilot

    campaign = tiny_campaign(tmp_path / "c", **{"training.distributed.strategy": "ddp",
                                                "training.distributed.nproc": 2})  # fmt: skip
    ws = Workspace.open(campaign)
    result = execute_pilot(ws)
    gates = json.loads((result.folder / "gates.json").read_text(encoding="utf-8"))
    row = gates["rows"][-1]
    assert (row["number"], row["phase"], row["verdict"]) == (14, "replicas", "PASS"), row
    ranks = row["details"]["rows"]
    assert [(r["rank"], r["phase"]) for r in ranks] == [(k, p) for k in (0, 1) for p in PHASES]
    for r in ranks:
        assert r["inputs"]["world_size"] == 2 and r["verdict"] == "PASS"
        memory = r["memory"]
        assert memory["counters"] == ["rss"] and memory["devices"] == ["cpu"]  # same bounds
        assert memory["readings"][0]["peak_bytes"] > 0 and r["duration_s"] > 0
    losses = {r["rank"]: r["details"]["loss"] for r in ranks if r["phase"] == "first step"}
    assert losses[0] == losses[1]
    assert len(set(row["details"]["trainable_sha256"].values())) == 1  # identical replicas
    html = pilot(collect(ws))
    assert "Every rank, every phase (S4, S5, B3, B4)" in html and "first step (rank 1)" in html
