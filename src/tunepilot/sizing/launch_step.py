"""One step of a launched job (`tunepilot plan --emit skypilot`), safe to repeat after a
preemption: a restarted job calls the same lines again and each goes on where it stopped.

    python -m tunepilot.sizing.launch_step run CAMPAIGN VARIANT SEED
    python -m tunepilot.sizing.launch_step target CAMPAIGN

`run` trains one variant x seed, or continues it: the ledger decides. A run of that variant
and seed that ended (completed, diverged, failed, invalid: V3 keeps its line) is done; one
left `interrupted` or `running` by a stopped instance is resumed from its newest checkpoint
that verifies; otherwise a new run starts. The machine's shape comes from the task file's
environment: TUNEPILOT_NPROC GPUs per node, TUNEPILOT_NNODES nodes, TUNEPILOT_HEAD the head
node's address, SKYPILOT_NODE_RANK this node. With several nodes every node calls the same
line: node 0 goes through `tunepilot run` / `tunepilot resume` (it owns the ledger), the
others start the same torchrun group's worker ranks, which write nothing.

`target` prints the run to export and verify: `experiments.guards.export_target`, the one
rule the demo uses too (the adopted variant, else the control, whose guards pass).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tunepilot.sizing.launch import RDZV_PORT, rendezvous_flags

ENDED = frozenset({"completed", "diverged", "failed", "invalid"})
RESUMABLE = frozenset({"interrupted", "running"})


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip().isdigit() else default


def run_action(campaign: Path, variant: str, seed: int) -> tuple[str, str | None]:
    """("done" | "resume" | "new", run id) for this variant x seed, read from the ledger."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.ledger import Ledger

    ws = Workspace.open(campaign)
    if not ws.ledger_path.exists():
        return "new", None
    with Ledger.open(ws.ledger_path) as ledger:
        rows = [r for r in ledger.list_runs() if r.variant == variant and r.seed == seed]
    if any(r.status in ENDED for r in rows):
        return "done", next(r.id for r in rows if r.status in ENDED)
    stopped = [r for r in rows if r.status in RESUMABLE]
    if stopped:
        return "resume", stopped[-1].id
    return "new", None


def node_command(campaign: Path, variant: str, seed: int) -> list[str] | None:
    """The command this node runs for one variant x seed (None: nothing left to do)."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.experiments.jobs import torchrun_command

    action, run_id = run_action(campaign, variant, seed)
    if action == "done":
        return None
    nproc, nnodes = _env_int("TUNEPILOT_NPROC", 1), _env_int("TUNEPILOT_NNODES", 1)
    rank = _env_int("SKYPILOT_NODE_RANK", 0)
    flags: list[str] = []
    if nnodes > 1:
        head = os.environ.get("TUNEPILOT_HEAD") or "127.0.0.1"
        job = os.environ.get("SKYPILOT_TASK_ID") or "tunepilot"
        flags = rendezvous_flags(nnodes, head, f"{job}-{variant}-s{seed}",
                                 _env_int("TUNEPILOT_RDZV_PORT", RDZV_PORT))  # fmt: skip
    if rank > 0:  # a worker node: the group's other ranks, run id broadcast by global rank 0
        strategy = Workspace.open(campaign).campaign.training.distributed.strategy
        return torchrun_command(campaign, nproc, variant, seed, (), flags,
                                strategy="ddp" if strategy == "none" else strategy,
                                run_id=run_id, resume=action == "resume")  # fmt: skip
    cli = [sys.executable, "-m", "tunepilot.cli"]
    spread = ["--nproc", str(nproc), *[f"--torchrun-arg={f}" for f in flags]] if (
        nproc > 1 or nnodes > 1) else []  # fmt: skip
    if action == "resume":
        return [*cli, "resume", str(run_id), str(campaign), *spread]
    return [*cli, "run", str(campaign), "--variant", variant, "--seeds", str(seed), *spread]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 4 and args[0] == "run":
        cmd = node_command(Path(args[1]), args[2], int(args[3]))
        if cmd is None:
            print(f"{args[2]} seed {args[3]}: ended before, nothing to do", file=sys.stderr)
            return 0
        print("launch: " + " ".join(cmd), file=sys.stderr)
        sys.stdout.flush()
        os.execv(cmd[0], cmd)  # the command's own exit code and signals, nothing in between
    if len(args) == 2 and args[0] == "target":
        from tunepilot.data.workspace import Workspace
        from tunepilot.experiments.compare import compare_campaign
        from tunepilot.experiments.guards import export_target

        ws = Workspace.open(Path(args[1]))
        target, why = export_target(ws, compare_campaign(ws))
        print(f"deliver: {why}", file=sys.stderr)
        if target is None:
            return 1
        print(target)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
