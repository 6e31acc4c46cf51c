"""One rank of a distributed run: the process torchrun starts (B3, B4, S7).

    tunepilot run campaign.yaml --variant control --seeds 0 --nproc 2 [--strategy fsdp]
      -> jobs.run_distributed: checks the input, prepares the data once, reserves the run id
      -> python -m torch.distributed.run --standalone --nproc_per_node 2
             -m tunepilot.experiments.worker campaign.yaml --variant control --seed 0 --run-id ID

Every rank builds the same session and model (same seed), wraps it (DDP or FSDP2) and runs
the one loop (`loop.train`) on its share of each update. Rank 0 alone talks to the ledger and
writes files: registration, `running`, the curve, the final evaluation, the final status. The
world size, strategy and examples per update are printed at start and recorded in the run's
config.resolved.yaml (`_run` block and `training.distributed`) and in the ledger's budget.

`training.distributed` is set to what really ran (strategy, world size), so it is part of the
run's config and settings hash: a checkpoint resumes only on the same world size (see
distributed.py for what happens to the weights and optimizer state on another one).

Multi-node: torchrun's own flags (`--nnodes`, `--rdzv-backend`, `--rdzv-endpoint`, ...) are
passed through unchanged; the campaign folder must then be on a filesystem every node sees.
The run id a launcher reserved wins, whichever node holds global rank 0 (c10d orders nodes
by address), so node 0 runs `tunepilot run` and the others may start only the worker ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from tunepilot.campaign import Campaign
from tunepilot.campaign.variants import CONTROL, variant_diff
from tunepilot.data.workspace import Workspace
from tunepilot.errors import InputError, input_error
from tunepilot.experiments.runner import (
    LEDGER_STATUS,
    RunOutcome,
    Session,
    control_run_for,
    model_kind,
    pad_id_of,
    predictions_from_rows,
    run_campaign_for,
    trackers_for,
    write_run_files,
)
from tunepilot.measure.phase_log import PhaseLog
from tunepilot.train.checkpoint import unwrap
from tunepilot.train.distributed import (
    STRATEGIES,
    DistContext,
    barrier,
    broadcast_text,
    first_given_text,
    init_process_group_from_env,
    is_fully_sharded,
    shutdown,
    wrap_model,
)


def distributed_campaign(
    ws: Workspace, variant: str, seed: int, strategy: str, world_size: int
) -> Campaign:
    """The variant's campaign with its seed and the distribution that really runs it."""
    from tunepilot.campaign.optimizer_rules import optimizer_problems
    from tunepilot.campaign.schema import Distributed
    from tunepilot.errors import InputError, Problem

    campaign = run_campaign_for(ws, variant, seed)
    distributed = Distributed(strategy=strategy, nproc=world_size)  # type: ignore[arg-type]
    training = campaign.training.model_copy(update={"distributed": distributed})
    problems = optimizer_problems(training)  # the schema's rules, for what --strategy chose
    if problems:
        raise InputError([Problem("training", p, "change the settings as the sentence says")
                          for p in problems], title="cannot train with replicas so")  # fmt: skip
    return campaign.model_copy(update={"training": training})


def execute_distributed_run(
    ws: Workspace,
    ctx: DistContext,
    *,
    strategy: str,
    variant: str = CONTROL,
    seed: int = 0,
    run_id: str | None = None,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool | None = None,
) -> RunOutcome:
    """`runner.execute_run` for one rank of a torchrun group; rank 0 owns the ledger."""
    from tunepilot.ledger import Ledger
    from tunepilot.train.arithmetic import plan_updates
    from tunepilot.train.loop import train
    from tunepilot.train.packing import packing_of

    session = Session(ws)
    campaign = distributed_campaign(ws, variant, seed, strategy, ctx.world_size)
    t = campaign.training
    # Rank 0 encodes first: preparing may write the split files, which must not race.
    encoded = session.encoded(campaign) if ctx.is_main else None
    barrier()
    encoded = encoded or session.encoded(campaign)
    plan = plan_updates(
        len(encoded.train), t.microbatch, t.accumulation, ctx.world_size,
        updates=t.budget.updates, epochs=t.budget.epochs, drop_last=t.drop_last,
    )  # fmt: skip
    shape = {
        "world_size": ctx.world_size, "strategy": strategy, "backend": ctx.backend,
        "microbatch": t.microbatch, "accumulation": t.accumulation,
        "examples_per_update": plan.examples_per_update,
    }  # fmt: skip

    run_id = first_given_text(run_id, ctx)  # the id a launcher reserved, on whichever node
    with Ledger.open(ws.ledger_path) if ctx.is_main else contextlib.nullcontext() as ledger:
        if ctx.is_main:
            run_id = _start(ws, ledger, campaign, encoded, variant, seed, run_id, resume,
                            shape, plan.describe())  # fmt: skip
            from tunepilot.console import console

            console.print(
                f"[bold]{run_id}[/]: world size {ctx.world_size} ({strategy}, {ctx.backend} on "
                f"{ctx.device.split(':')[0]}): {plan.describe()}", highlight=False, soft_wrap=True,
            )  # fmt: skip
        run_id = broadcast_text(run_id, ctx)
        run_dir = ws.runs_dir / run_id

        def on_update(record: dict[str, Any]) -> None:
            if ledger is not None:
                ledger.record_update(run_id, record["update"], record["loss"], lr=record["lr"])
                ledger.heartbeat(run_id, pid=os.getpid())

        last_eval: list[Any] = []

        def evaluate_point(model: Any) -> dict[str, Any]:  # every rank its share (B3, B4)
            label = f"validation of {run_id}" if ctx.is_main and progress is not False else None
            ranks = (ctx.rank, ctx.world_size, is_fully_sharded(model))
            last_eval[:] = [session.evaluate(model, campaign, label=label, ranks=ranks)]
            return last_eval[0].metrics

        previous = _record_sigterm() if ctx.is_main else None
        try:
            phases = PhaseLog.for_run(run_dir, ctx.device, ctx.rank, ctx.world_size)  # S5
            with phases.phase("load"):
                model = _build_wrapped(session, campaign, seed, strategy, ctx)
            result = train(
                model, encoded.train, t, run_dir, kind=model_kind(campaign),  # type: ignore[arg-type]
                pad_id=pad_id_of(ws.tokenizer), evaluate=evaluate_point,
                resume=run_dir if resume else None, rank=ctx.rank, world_size=ctx.world_size,
                on_update=on_update, progress=progress, stop_after=stop_after, phases=phases,
                label=f"training {run_id}", packing=packing_of(campaign), sinks=trackers_for(
                    ws, campaign, run_id, variant, seed, encoded.prepared.version
                ) if ctx.is_main else (),
            )  # fmt: skip
            status = LEDGER_STATUS[result.status]
            if status == "completed" and not last_eval:  # every rank evaluates its share
                evaluate_point(model if is_fully_sharded(model) else unwrap(model))
        except (KeyboardInterrupt, _Terminated) as stop:
            if ledger is not None:
                ledger.set_status(run_id, "interrupted", f"{stop or 'stopped from the keyboard'}"
                                  f"; resume it with `tunepilot resume {run_id}`")  # fmt: skip
            raise
        except Exception as exc:
            if ledger is not None:
                ledger.set_status(run_id, "failed", f"{type(exc).__name__}: {exc}"[:2000])
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

        reason = result.reason + (
            f"; continue with `tunepilot resume {run_id} {ws.campaign_file}`"
            if result.status in ("paused", "stopped") else ""
        )  # fmt: skip
        metrics: dict[str, Any] = {}
        if ledger is not None:
            if status == "completed":
                final = last_eval[0]
                metrics = final.metrics
                ledger.record_evaluation(
                    run_id, "validation", final.metrics, eval_config_hash=final.config_hash,
                    data_version=encoded.prepared.version, update=result.updates,
                    predictions=predictions_from_rows(final.rows),
                )  # fmt: skip
            ledger.set_status(run_id, status, reason)
    return RunOutcome(
        run_id, status, reason, result.updates, run_dir, metrics, result.update_seconds
    )


def _build_wrapped(session: Session, campaign: Campaign, seed: int, strategy: str,
                   ctx: DistContext) -> Any:  # fmt: skip
    """The rank's model: FSDP shards built before the weights are read for a causal LM
    (sharded_build.py), else the whole model loaded, then wrapped (DDP, or FSDP)."""
    if strategy == "fsdp" and model_kind(campaign) == "causal_lm":
        from tunepilot.train.sharded_build import build_sharded_model

        return build_sharded_model(campaign, session.ws.model_source, ctx, seed,
                                   getattr(session.ws.tokenizer, "pad_token_id", None))  # fmt: skip
    return wrap_model(session.build_model(campaign, seed, ctx.device), strategy, ctx)


def _start(
    ws: Workspace, ledger: Any, campaign: Campaign, encoded: Any, variant: str, seed: int,
    run_id: str | None, resume: bool, shape: dict[str, Any], plan: str,
) -> str:  # fmt: skip
    """Rank 0: register the run (or find the one to resume), write its files, mark it running."""
    data_version = encoded.prepared.version
    if resume:
        if run_id is None:
            raise input_error("--run-id", "missing", "name the run to resume")
        ledger.get_run(run_id)
    else:
        run_id = run_id or ledger.new_run_id(variant, seed)
        ledger.register_run(
            campaign=ws.campaign.name, variant=variant, seed=seed,
            config_hash=campaign.config_hash(), data_version=data_version,
            control_run=control_run_for(ledger, seed) if variant != CONTROL else None,
            diff=variant_diff(ws.campaign, variant),
            budget={**campaign.training.budget.model_dump(), **shape}, run_id=run_id,
        )  # fmt: skip
        write_run_files(ws.runs_dir / run_id, campaign, {
            "run_id": run_id, "variant": variant, "seed": seed, "data_version": data_version,
            "retry_of": None, **shape, "plan": plan})  # fmt: skip
    ranks = f"{shape['world_size']} ranks ({shape['strategy']}, {shape['backend']})"
    per_update = f"{shape['examples_per_update']} examples per update"
    ledger.set_status(
        run_id, "running", f"pid {os.getpid()} (rank 0 of {ranks}); {per_update}", pid=os.getpid()
    )
    ledger.heartbeat(run_id, pid=os.getpid())
    return run_id


class _Terminated(Exception):
    """SIGTERM on rank 0: torchrun stops every rank when one fails or when it is stopped."""


def _record_sigterm() -> Any:
    def handler(signum: int, frame: Any) -> None:
        raise _Terminated("stopped by SIGTERM (torchrun stops every rank when one rank fails "
                          "or when it is stopped; its output says which)")  # fmt: skip

    return signal.signal(signal.SIGTERM, handler)


# ---------------------------------------------------------------------------------------------
# the per-process entry point
# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tunepilot.experiments.worker CAMPAIGN [key=value ...] --variant V --seed S`."""
    parser = argparse.ArgumentParser(prog="tunepilot.experiments.worker", description=__doc__)
    parser.add_argument("campaign")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    parser.add_argument("--variant", default=CONTROL)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--strategy", choices=STRATEGIES, default="ddp")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--stop-after", type=int, default=None)
    args = parser.parse_args(argv)

    from tunepilot.console import print_input_error

    try:
        ctx = init_process_group_from_env()
    except InputError as err:
        print_input_error(err)
        return 2
    clean = False
    try:
        ws = Workspace.open(args.campaign, args.overrides)
        execute_distributed_run(
            ws, ctx, strategy=args.strategy, variant=args.variant, seed=args.seed,
            run_id=args.run_id, resume=args.resume, stop_after=args.stop_after,
        )  # fmt: skip
        clean = True
    except InputError as err:
        if ctx.is_main:
            print_input_error(err)
        else:
            print(f"rank {ctx.rank}: {err.title}", file=sys.stderr)
        return 2
    finally:
        shutdown(ctx, clean=clean)
    return 0


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown. Everything is on disk by now (checkpoints are
    renamed into place, ledger writes are committed); what teardown would run is gloo's C++
    destructors, which abort now and then after a finished run (SIGABRT, ENV.md), turning a
    good run into a failed torchrun. The barrier in `shutdown` made that rare; this makes it
    impossible."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
