"""Gate 14 of a DDP or FSDP campaign: the pilot's step gates in real replicas (S4, S5, B3, B4).

One process measures one replica's worth of nothing: under DDP every rank holds a full copy
and all-reduces gradients, under FSDP every rank holds a shard and gathers each block before
it runs, and both join collectives a single process never sees. So for a campaign with
`training.distributed` (ddp or fsdp, nproc >= 2) the pilot starts
`torchrun --nproc_per_node N -m tunepilot.pilot.replicas SPEC` and every rank runs the gates
that change under replication, with the same gate functions and the same memory probe as the
single-process pilot, each between two barriers so every rank's phase has the same bounds:

    load (and wrap), first step, steady step, evaluation, checkpoint

Each rank writes `replicas/rank-K.json`: one row per phase (inputs with the world size,
memory per counter on its own device, duration, verdict). The gate's row in gates.json holds
all of them (`details.rows`, one per rank per phase) and judges what replication must keep:
every rank ran every phase; the same examples gave every rank the same first-step loss; and
under DDP the replicas hold identical trainable weights after the steady updates (B3).

Every rank evaluates here (under DDP a run evaluates on rank 0 only; the rows then show what
that rank costs, on every rank); under DDP rank 0 alone writes the checkpoint, under FSDP
every rank joins its gather (B4). A gate that fails on one rank stops every rank: the others
would wait for it in the next collective.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tunepilot.pilot.gates import (
    checkpoint_inputs,
    checkpoint_outcome,
    evaluation_gate,
    first_step_gate,
    load_gate,
    steady_step_gate,
)
from tunepilot.pilot.phases import Gate, GateRow, Outcome, PilotState, run_gate, worst_verdict
from tunepilot.verdict import Verdict

REPLICA_TIMEOUT_S = 1200
REPLICATED = ("load", "first step", "steady step", "evaluation", "checkpoint")


def replicated(campaign: Any) -> tuple[str, int] | None:
    """(strategy, world size) when the campaign trains with data replicas, else None."""
    dist = campaign.training.distributed
    return (dist.strategy, dist.nproc) if dist.strategy != "none" and dist.nproc > 1 else None


# ---------------------------------------------------------------------------------------------
# the gate, in the pilot's process
# ---------------------------------------------------------------------------------------------


def replicas_gate(state: PilotState) -> Outcome:
    """Gate 14: start the ranks, gather their rows, judge what replication must keep."""
    from tunepilot.experiments.jobs import torchrun_env, torchrun_prefix

    strategy, world = replicated(state.campaign) or ("ddp", 1)
    out = state.folder / "replicas"
    out.mkdir(parents=True, exist_ok=True)
    spec = {"campaign_file": str(state.ws.campaign_file), "overrides": state.ws.overrides,
            "seed": state.seed, "strategy": strategy, "pilot_id": state.pilot_id,
            "out": str(out)}  # fmt: skip
    (out / "spec.json").write_text(json.dumps(spec, indent=2), encoding="utf-8")
    command = [*torchrun_prefix(world), "-m", "tunepilot.pilot.replicas", str(out / "spec.json")]
    state.shape = {"world_size": world}
    tick = time.perf_counter()
    try:
        done = subprocess.run(command, env=torchrun_env(world), capture_output=True, text=True,
                              timeout=REPLICA_TIMEOUT_S, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return Outcome(Verdict.FAIL, f"{world} ranks ({strategy}) did not finish in "
                       f"{REPLICA_TIMEOUT_S} s (a rank stuck in a collective?): run "
                       f"`{' '.join(command)}` to see it", inputs={"world_size": world})
    seconds = time.perf_counter() - tick
    ranks = [json.loads(p.read_text(encoding="utf-8"))
             for p in sorted(out.glob("rank-*.json"), key=lambda p: int(p.stem[5:]))]  # fmt: skip
    if done.returncode != 0 or len(ranks) != world:
        tail = " | ".join(done.stderr.strip().splitlines()[-4:])[:500]
        return Outcome(Verdict.FAIL, f"torchrun with {world} ranks ({strategy}) exited "
                       f"{done.returncode} with {len(ranks)} rank report(s): {tail}",
                       {"stderr": done.stderr[-6000:]}, {"world_size": world})  # fmt: skip
    return _judge(ranks, strategy, world, seconds)


def _judge(ranks: list[dict[str, Any]], strategy: str, world: int, seconds: float) -> Outcome:
    rows = [row | {"rank": r["rank"]} for r in ranks for row in r["rows"]]
    problems = [f"rank {r['rank']} {r['phase']}: {r['sentence']}" for r in rows
                if r["verdict"] == Verdict.FAIL]  # fmt: skip
    losses = {r["rank"]: (r.get("details") or {}).get("loss") for r in rows
              if r["phase"] == "first step"}  # fmt: skip
    if len(set(losses.values())) > 1:
        problems.append(f"the same examples gave the ranks different first-step losses "
                        f"{losses}: the replicas do not start from the same model (B3)")
    digests = {r["rank"]: r.get("trainable_sha256") for r in ranks}
    same = strategy == "ddp" and len(set(digests.values())) == 1 and None not in digests.values()
    if strategy == "ddp" and not same:
        problems.append(f"the replicas' trainable weights differ after the steady updates "
                        f"({digests}): gradients are not synchronised (B3)")
    backend, kind = ranks[0].get("backend"), ranks[0].get("device", "cpu").split(":")[0]
    peaks = "; ".join(f"rank {r['rank']} {_peak(r['rows'], 'first step')}" for r in ranks)
    details = {"world_size": world, "strategy": strategy, "backend": backend, "rows": rows,
               "trainable_sha256": digests, "seconds": seconds}  # fmt: skip
    head = (f"{world} ranks ({strategy}, {backend} on {kind}) in real processes ran "
            f"{', '.join(REPLICATED)}: one memory row per rank per phase")
    if problems:
        return Outcome(Verdict.FAIL, f"{head}; {'; '.join(problems[:3])}", details,
                       {"world_size": world})  # fmt: skip
    verdict = worst_verdict([Verdict(r["verdict"]) for r in rows])
    kept = ("replicas hold identical trainable weights after the steady updates" if same
            else "each rank holds its shard (FSDP)")  # fmt: skip
    return Outcome(verdict, f"{head} (first step peak: {peaks}); first-step loss "
                   f"{next(iter(losses.values())):.6g} on every rank; {kept} (B3, B4)", details,
                   {"world_size": world})  # fmt: skip


def _peak(rows: list[dict[str, Any]], phase: str) -> str:
    from tunepilot.measure.memory import human_bytes

    row = next((r for r in rows if r["phase"] == phase), None)
    readings = ((row or {}).get("memory") or {}).get("readings") or []
    best = max((x["peak_bytes"] for x in readings if x.get("peak_bytes") is not None), default=None)
    return human_bytes(best)


# ---------------------------------------------------------------------------------------------
# one rank
# ---------------------------------------------------------------------------------------------


def _gates(ctx: Any, strategy: str) -> list[Gate]:
    """The replicated gates, numbered as in the single-process pilot."""
    from tunepilot.train.distributed import wrap_model

    def load(state: PilotState) -> Outcome:
        outcome = load_gate(state)
        state.model = wrap_model(state.model, strategy, ctx)
        outcome.sentence += f"; wrapped for {strategy} as rank {ctx.rank} of {ctx.world_size}"
        return outcome

    def evaluation(state: PilotState) -> Outcome:
        from tunepilot.train.checkpoint import unwrap

        wrapped = state.model
        state.model = unwrap(wrapped) if strategy == "ddp" else wrapped  # FSDP: a collective
        try:
            return evaluation_gate(state)
        finally:
            state.model = wrapped

    def checkpoint(state: PilotState) -> Outcome:
        from tunepilot.train import rng
        from tunepilot.train.checkpoint import save_checkpoint
        from tunepilot.train.sharded import save_gathered_checkpoint

        sampler, extra = checkpoint_inputs(state, ctx.world_size)
        tick = time.perf_counter()
        generators = rng.gather(ctx.rank, ctx.world_size)  # every rank's, as a run saves them
        root = state.folder / "checkpoint"
        if strategy == "fsdp":
            folder = save_gathered_checkpoint(root, state.updates_done, state.model,
                                              state.optimizer, sampler, extra, 1, generators)
        elif ctx.is_main:
            folder = save_checkpoint(root, state.updates_done, state.model, state.optimizer,
                                     sampler, extra, 1, generators)  # fmt: skip
        else:
            return Outcome(Verdict.PASS, "under DDP rank 0 writes the checkpoint; this rank "
                           "sent its generators and waits (R1)")  # fmt: skip
        if not ctx.is_main:
            return Outcome(Verdict.PASS, "joined the gather of the sharded state; rank 0 wrote "
                           f"{folder.name} (B4)")  # fmt: skip
        return checkpoint_outcome(state, folder, tick)

    return [Gate(4, "load", "P1, S4, B3, B4", load),
            Gate(6, "first step", "S1, S4", first_step_gate, ("load",)),
            Gate(7, "steady step", "S4, S5", steady_step_gate, ("first step",)),
            Gate(10, "evaluation", "S4, V2", evaluation, ("load",)),
            Gate(11, "checkpoint", "R1, S4", checkpoint, ("first step",))]  # fmt: skip


def trainable_sha256(model: Any) -> str:
    """sha256 of this rank's trainable tensors (its shard under FSDP), in name order."""
    import torch

    from tunepilot.train.checkpoint import unwrap

    digest = hashlib.sha256()
    for name, p in sorted(unwrap(model).named_parameters()):
        if p.requires_grad:
            local = p.to_local() if hasattr(p, "to_local") else p
            raw = local.detach().cpu().contiguous().view(torch.uint8)  # any dtype, bf16 too
            digest.update(name.encode() + raw.numpy().tobytes())
    return digest.hexdigest()


def rank_main(spec_path: str) -> int:
    """Run the replicated gates on this rank and write `rank-K.json`."""
    import torch

    from tunepilot.campaign.variants import CONTROL
    from tunepilot.console import json_safe
    from tunepilot.data.workspace import Workspace
    from tunepilot.experiments.runner import Session
    from tunepilot.experiments.worker import distributed_campaign
    from tunepilot.measure.memory import MemoryProbe
    from tunepilot.train.distributed import (
        all_reduce_value,
        barrier,
        init_process_group_from_env,
        shutdown,
    )

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    ctx = init_process_group_from_env()
    clean = False
    try:
        ws = Workspace.open(spec["campaign_file"], spec["overrides"])
        seed = int(spec["seed"])
        campaign = distributed_campaign(ws, CONTROL, seed, spec["strategy"], ctx.world_size)
        session = Session(ws)
        encoded = session.encoded(campaign)  # the parent's data gate already wrote the splits
        folder = Path(spec["out"]) / f"rank-{ctx.rank}"
        folder.mkdir(parents=True, exist_ok=True)
        state = PilotState(ws, spec["pilot_id"], folder, campaign, seed,
                           torch.device(ctx.device), MemoryProbe.for_device(ctx.device))
        state.session, state.encoded, state.prepared = session, encoded, encoded.prepared
        rows: dict[str, GateRow] = {}
        stopped = None
        for gate in _gates(ctx, spec["strategy"]):
            barrier()  # every rank's phase starts together: the same bounds (S5)
            if stopped is None:
                row = run_gate(state, gate, rows)
            else:
                row = GateRow(gate.number, gate.name, state.default_inputs(), None, None,
                              str(Verdict.FAIL), f"not run: {stopped} failed on a rank",
                              gate.requirement, {"not_run": True})  # fmt: skip
            row.inputs["world_size"] = ctx.world_size
            rows[gate.name] = row
            if all_reduce_value(float(row.verdict == Verdict.FAIL), ctx.world_size) and not stopped:
                stopped = gate.name  # every rank stops: the others would wait in a collective
        digest = trainable_sha256(state.model) if state.model is not None else None
        shutil.rmtree(folder / "checkpoint", ignore_errors=True)  # measured; not kept
        report = {"rank": ctx.rank, "world_size": ctx.world_size, "strategy": spec["strategy"],
                  "backend": ctx.backend, "device": ctx.device, "trainable_sha256": digest,
                  "rows": [r.to_json() for r in rows.values()]}  # fmt: skip
        text = json.dumps(json_safe(report), indent=2)
        (Path(spec["out"]) / f"rank-{ctx.rank}.json").write_text(text, encoding="utf-8")
        clean = True
    finally:
        shutdown(ctx, clean=clean)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: torchrun ... -m tunepilot.pilot.replicas SPEC.json\n")
        raise SystemExit(2)
    from tunepilot.experiments.worker import exit_now

    exit_now(rank_main(sys.argv[1]))
