"""THE training loop: microbatches, token-weighted accumulation, precision, stop causes (S2, S3).

Read `train` top to bottom; it is the whole story. The decisions that matter:

* Loss normalisation (S2). One update is built from several microbatches (and, with data
  replicas, several ranks). Each microbatch's loss is a *sum* over its target tokens (or
  examples, for classification), divided by the number of targets in the *whole update*,
  counted before the first forward and summed over ranks. The gradients then add up to the
  gradient of the update's mean loss however the update is split: accumulation 8 x microbatch
  2 equals accumulation 1 x microbatch 16, and a final partial update or a microbatch of short
  sequences carries exactly its share. Averaging per microbatch and dividing by the
  accumulation count, the common shortcut, weights a token in a short microbatch more than
  one in a long microbatch.
* Precision (S3). bf16 runs the forward under autocast and needs no scaling (it has fp32's
  range). fp16 is for CUDA only and needs a GradScaler: it scales the update's loss (already
  normalised over the whole update) and unscales once per update, before clipping, so the
  scale matches the effective batch. The loss is never computed in half precision.
* Stop causes are decided before the trial (V4): the budget, a non-finite loss (diverged: the
  update is not applied and its line is kept, V3), a loss bound and a wall clock.
* Resume (R1) restores weights, optimizer, sampler position and generators (every rank's:
  each draws its own dropout masks), and the lr is a pure function of the update index, so a
  resumed run continues the identical curve. Checkpoints are taken on a schedule (automatic
  by default: under 2% of the wall time), at the end, and at the update boundary after a
  SIGTERM or Ctrl-C (stopping.py), so a preempted run has a point to resume from.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tunepilot.console import warn
from tunepilot.errors import input_error
from tunepilot.measure.phase_log import PhaseLog
from tunepilot.model.build import enable_activation_checkpointing
from tunepilot.progress import Progress
from tunepilot.tasks.base import Encoded
from tunepilot.train import rng
from tunepilot.train.arithmetic import UpdatePlan, plan_updates
from tunepilot.train.batching import (  # backward_update: re-exported for the pilot's gates
    Kind,
    UpdateSampler,
    backward_update,
)
from tunepilot.train.checkpoint import (
    check_identity,
    load_checkpoint,
    restore_position,
    run_identity,
    save_checkpoint,
    step_folder,
    unwrap,
)
from tunepilot.train.distributed import all_reduce_grads, all_reduce_value, is_fully_sharded
from tunepilot.train.feed import UpdateFeed
from tunepilot.train.loss import kernel_that_runs
from tunepilot.train.optimizer import build_optimizer, host_values, update_norm
from tunepilot.train.packing import Packing
from tunepilot.train.precision import autocast_and_scaler
from tunepilot.train.records import Records, RecordSink
from tunepilot.train.resume_point import load_resumable, set_aside_newer
from tunepilot.train.runtime import cuda_switches
from tunepilot.train.schedule import lr_at
from tunepilot.train.sharded import load_gathered_checkpoint, save_gathered_checkpoint
from tunepilot.train.stopping import CheckpointSchedule, StopSignals

Status = Literal[
    "completed", "diverged", "stopped_loss_bound", "stopped_wall_clock", "paused", "stopped"
]


@dataclass
class TrainResult:
    """How a call to `train` ended. A diverged or stopped run is a result, not an exception."""

    status: Status
    updates: int  # updates applied in the run so far (across resumes)
    last_loss: float | None
    reason: str
    examples_seen: int = 0
    plan: UpdatePlan | None = None
    last_checkpoint: Path | None = None
    update_seconds: list[float] = field(default_factory=list)  # this call's updates only
    resumed_from: Path | None = None
    refused: list[str] = field(default_factory=list)  # newer checkpoints that did not verify
    signal: str = ""  # SIGTERM or SIGINT when status is "stopped"


def train(
    model: Any,
    train_data: Sequence[Encoded],
    settings: Any,
    run_dir: Path,
    *,
    kind: Kind,
    pad_id: int,
    evaluate: Callable[[Any], dict[str, Any]] | None = None,
    resume: Path | None = None,
    rank: int = 0,
    world_size: int = 1,
    on_update: Callable[[dict[str, Any]], None] | None = None,
    progress: bool | None = None,
    stop_after: int | None = None,
    sinks: Sequence[RecordSink] = (),
    label: str = "training",
    stop: StopSignals | None = None,
    phases: PhaseLog | None = None,
    packing: Packing | None = None,
) -> TrainResult:
    """Train `model` in place on `train_data` under `settings` (a TrainingSettings).

    `resume` is a step folder, or a run folder whose latest checkpoint is taken.
    `stop_after` ends this call once the run has applied that many updates (status
    "paused", checkpoint written): a planned interruption, e.g. to test resume (R1).
    `progress` False hides rank 0's progress (a bar on a terminal, a line a minute in logs).
    Records go to metrics.jsonl / evals.jsonl and then to `sinks` (trackers, rank 0 only).
    `stop`: the caller's listener for SIGTERM/SIGINT (None: listen while training); a signal
    ends the call at the next update boundary with a checkpoint (status "stopped").
    With world_size > 1 the process group must be initialised; a DDP-wrapped or FSDP2
    (`fully_shard`) model syncs its own gradients, a plain one is synced here. With replicas
    every rank runs `evaluate` (the worker's shares the examples out, evaluate_sharded.py;
    FSDP2's forwards are collectives anyway). Every rank joins checkpoints (its generators are
    saved too); rank 0 writes them. `phases` measures this rank's memory in its first and a
    steady update, first evaluation and checkpoint (S5). `packing` (data.packing) packs each
    microbatch's examples into rows (packing.py); which examples form an update is unchanged.
    """
    import torch

    if kind not in ("classification", "causal_lm"):
        raise ValueError(f"kind must be classification or causal_lm, not {kind!r}")
    run_dir = Path(run_dir)
    device = next(model.parameters()).device
    autocast, scaler = autocast_and_scaler(settings.precision, device)
    loss_kernel = kernel_that_runs(settings.loss_kernel, device.type)  # as env.json records
    is_ddp = hasattr(model, "no_sync")
    # FSDP2 (`fully_shard`) averages gradients over ranks in backward like DDP, but its state
    # is sharded: every rank joins evaluation and checkpoints (gathers), rank 0 writes (B4).
    is_fsdp = is_fully_sharded(model)
    phases = phases or PhaseLog.off()
    evaluate = phases.wrap("evaluation", evaluate) if evaluate is not None else None
    syncs_itself = is_ddp or is_fsdp
    joins = rank == 0 or is_fsdp
    evaluates = joins or world_size > 1  # every replica evaluates its share (the worker's)

    # Seeds first: whatever is built below and draws random numbers must draw the same ones.
    rng.seed_everything(settings.seed + 1_000_003 * rank)

    lengths = [len(e.input_ids) for e in train_data]
    sampler = UpdateSampler(
        lengths, settings.microbatch, settings.accumulation, seed=settings.seed,
        drop_last=settings.drop_last, bucket_by_length=settings.bucket_by_length,
        rank=rank, world_size=world_size,
    )  # fmt: skip
    plan = plan_updates(
        len(train_data), settings.microbatch, settings.accumulation, world_size,
        updates=settings.budget.updates, epochs=settings.budget.epochs,
        drop_last=settings.drop_last,
    )  # fmt: skip
    identity = run_identity(settings, train_data)
    packing = packing.for_model(unwrap(model)) if packing is not None else None
    identity["packing"] = repr(packing) if packing else None  # type: ignore[assignment]

    # Activation checkpointing (S3) changes how forward keeps activations: set it up front.
    if settings.activation_checkpointing:
        enable_activation_checkpointing(unwrap(model))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(model, settings)

    # Resume needs the optimizer built (its state is loaded into it) and comes before the
    # generators are restored, which must be the very last thing before the loop.
    records = Records(run_dir, rank, sinks)
    done, examples_seen, elapsed_before = 0, 0, 0.0
    last_checkpoint: Path | None = None
    refused: list[str] = []
    resumed_from: Path | None = None
    set_aside: Path | None = None  # the folder resumed from, when newer ones were refused
    if resume is not None:  # a step folder, or the newest verified one of a run folder
        load = load_gathered_checkpoint if is_fsdp else load_checkpoint
        folder, state, refused = load_resumable(Path(resume), lambda f: load(f, model, optimizer))
        if refused and rank == 0:
            warn(f"resuming from {folder.name}: newer checkpoint(s) did not verify and their "
                 f"updates will be trained again (set aside as refused-step-N at the next "
                 f"checkpoint): {'; '.join(refused)}")  # fmt: skip
            set_aside = folder
        check_identity(folder, state, identity)
        done, examples_seen, elapsed_before = restore_position(folder, state, sampler, scaler)
        last_checkpoint = folder
        resumed_from = folder
        records.rewind(done)
        generators = rng.of_rank(state, state["rng_tensors"], rank)
        if generators is not None:
            rng.restore(*generators)
        else:  # a checkpoint that saved rank 0's generators only: restart from a derived seed
            rng.seed_everything(settings.seed + 1_000_003 * rank + done)
    elif rank == 0 and records.metrics_path.exists() and records.metrics_path.stat().st_size:
        raise input_error(
            str(run_dir), "this run folder already holds metrics",
            "resume it, or start a new run id (a retry never replaces a run, V3)",
            title="run folder in use",
        )  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)

    total = plan.total_updates
    start = time.monotonic()
    status: Status = "completed"
    reason = f"budget of {total} updates reached"
    last_loss: float | None = None
    update_seconds: list[float] = []
    bar = Progress(label, total, "updates", done=done, show=rank == 0 and progress is not False)
    feed = UpdateFeed(sampler, train_data, kind, pad_id, device, packing)
    schedule = CheckpointSchedule(settings.checkpoint_every)

    def elapsed() -> float:
        return elapsed_before + time.monotonic() - start

    def checkpoint() -> Path:
        nonlocal set_aside
        generators = rng.gather(rank, world_size)  # every rank's, on rank 0: a collective
        if not joins:
            return step_folder(run_dir, done)  # rank 0 writes it
        if set_aside:  # before keep-last counts the refused folders (every rank has loaded)
            set_aside_newer(run_dir, set_aside)
            set_aside = None
        extra = {
            "seed": settings.seed, "examples_seen": examples_seen, "plan": plan.to_json(),
            "elapsed_seconds": elapsed(),
            "grad_scaler": scaler.state_dict() if scaler is not None else None, **identity,
        }  # fmt: skip
        keep, tick = settings.keep_last_checkpoints, time.perf_counter()
        save = save_gathered_checkpoint if is_fsdp else save_checkpoint
        saved = save(run_dir, done, model, optimizer, feed.state_dict(), extra, keep, generators)
        schedule.saved(time.perf_counter() - tick)
        return saved

    checkpoint = phases.wrap("checkpoint", checkpoint)

    deterministic_before = torch.are_deterministic_algorithms_enabled()
    if device.type == "cpu":  # CUDA would also need CUBLAS_WORKSPACE_CONFIG; CPU is exact
        torch.use_deterministic_algorithms(True)
    ended = "failed"  # what the trackers hear if an exception leaves the loop
    bar.start()
    records.start(done)
    signals, switches = stop or StopSignals(), cuda_switches(settings, device)  # TF32 (runtime.py)
    try:
        signals.__enter__()
        switches.__enter__()
        while done < total:
            tick = time.perf_counter()
            phases.begin_update(done)
            fed = feed.next()  # collated on the host, targets counted there (feed.py)
            batch, microbatches = fed.batch, fed.microbatches

            # 1. Count the whole update's targets, on all ranks, before any forward (S2).
            targets = int(all_reduce_value(float(fed.targets), world_size))
            if targets == 0:
                raise input_error(
                    f"update {done + 1}", "no position carries loss in this update",
                    "check the loss mask: every example needs target tokens (D5)",
                    title="nothing to learn",
                )  # fmt: skip

            # 2. Forward and backward every microbatch; gradients add up in .grad. DDP and
            # FSDP average over ranks themselves, so their normaliser is the per-rank share.
            # The lr is set first: with the step in backward each parameter steps in there.
            lr = lr_at(done, settings, total)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = backward_update(
                model, microbatches, kind, targets / world_size if syncs_itself else targets,
                autocast=autocast, scaler=scaler, is_ddp=is_ddp,
                weight=1.0 if batch.microbatches else 0.0, loss_chunks=settings.loss_chunks,
                loss_kernel=loss_kernel,
            )  # fmt: skip
            if world_size > 1 and not syncs_itself:
                all_reduce_grads(params)
            if scaler is not None:
                scaler.unscale_(optimizer)  # once per update, so clipping sees true gradients
            norm_tensor = update_norm(optimizer, params, settings.max_grad_norm)
            if done + 1 < total:
                feed.prefetch()  # the next update's host work overlaps the device's
            loss_sum, norm = host_values(loss_sum, norm_tensor)  # the update's one host sync
            loss = all_reduce_value(loss_sum, world_size) / targets
            record: dict[str, Any] = {
                "update": done + 1, "loss": loss, "lr": lr,
                "grad_norm": norm, "loss_tokens": targets,
                "examples": batch.update_examples,
                "examples_seen": examples_seen + batch.update_examples,
                "epoch": round(batch.epoch + (batch.index + 1) / plan.updates_per_epoch, 4),
            }  # fmt: skip

            # 3. Stop causes that refuse this update: it is not applied, its line is kept.
            if not math.isfinite(loss) or (scaler is None and not math.isfinite(norm)):
                status = "diverged"
                reason = f"update {done + 1}: loss {loss}, gradient norm {norm}"
            elif settings.stop.max_loss is not None and loss > settings.stop.max_loss:
                status = "stopped_loss_bound"
                reason = f"update {done + 1}: loss {loss:.4g} > stop.max_loss"
            if status != "completed":
                reason += ("; the update was already applied in backward "
                           "(training.optimizer_in_backward)" if settings.optimizer_in_backward
                           else "; the update was not applied")  # fmt: skip
                record.update(stopped=status, seconds=round(elapsed(), 3))
                records.update(record)
                optimizer.zero_grad(set_to_none=True)
                break

            # 4. Apply it at this update's lr, set above (a pure function of the index: resume
            # needs nothing else).
            if scaler is not None:
                scale = scaler.get_scale()
                scaler.step(optimizer)  # skipped when fp16 gradients overflowed
                scaler.update()
                record["skipped"] = scaler.get_scale() < scale
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done, examples_seen, last_loss = done + 1, examples_seen + batch.update_examples, loss
            # No device sync for the clock: on CUDA the time from one update's host sync to
            # the next is the device's, the optimizer step landing in the next update's span.
            update_seconds.append(time.perf_counter() - tick)
            phases.end()
            record.update(seconds=round(elapsed(), 3), update_seconds=round(update_seconds[-1], 4))
            records.update(record)
            if on_update is not None:
                on_update(record)
            bar.advance(done, f"loss {loss:.4f}")

            # 5. Evaluate and checkpoint on their schedules (rank 0 holds the files). The
            # automatic schedule reads the clock, so replicas decide together.
            if evaluate is not None and evaluates and done % settings.eval_every == 0:
                _evaluate(model, evaluate, records, done)
            if all_reduce_value(float(schedule.due(done, update_seconds[-1])), world_size):
                last_checkpoint = checkpoint()

            # 6. Stop causes that end the run after an applied update.
            # Replicas decide together, or one would wait forever in the next all-reduce.
            limit = settings.stop.wall_clock_minutes
            if limit is not None and all_reduce_value(float(elapsed() > 60 * limit), world_size):
                status, reason = "stopped_wall_clock", f"wall clock of {limit} min reached"
                break
            if stop_after is not None and stop_after <= done < total:
                status, reason = "paused", f"paused after update {done} as asked (stop_after)"
                break
            if all_reduce_value(float(signals.received is not None), world_size) and done < total:
                status = "stopped"
                reason = f"stopped by {signals.name or 'a signal'} after update {done}"
                break

        # The end: a last validation point (V5) and a checkpoint to resume or export from.
        # A diverged run keeps its weights from before the bad update but saves nothing.
        if status != "diverged":
            last_eval_due = status not in ("paused", "stopped") and done % settings.eval_every
            if evaluate is not None and evaluates and last_eval_due:
                _evaluate(model, evaluate, records, done)
            if last_checkpoint is None or last_checkpoint.name != f"step-{done:06d}":
                last_checkpoint = checkpoint()
        ended = status
    finally:
        phases.close()
        switches.__exit__(None, None, None)
        signals.__exit__(None, None, None)
        bar.stop(ended)
        records.close(ended)
        torch.use_deterministic_algorithms(deterministic_before)

    return TrainResult(
        status, done, last_loss, reason, examples_seen, plan, last_checkpoint, update_seconds,
        resumed_from=resumed_from, refused=refused,
        signal=signals.name if status == "stopped" else "",
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# setup, replicas, files, progress
# ---------------------------------------------------------------------------------------------


def _evaluate(
    model: Any, evaluate: Callable[[Any], dict[str, Any]], records: Records, done: int
) -> None:
    """Evaluate without moving the training generators, then back to training mode."""
    import torch

    inner = unwrap(model)
    with rng.fenced(), torch.no_grad():
        inner.eval()
        try:
            metrics = evaluate(inner)
        finally:
            inner.train()
    records.evaluation(done, metrics)
