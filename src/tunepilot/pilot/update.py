"""One update exactly as the loop builds it (S2, S3), for the pilot's step gates and the
memory grid: the loop's collate, target count, backward with its normalisation, autocast and
GradScaler, clipping and optimizer step; and the machine's load next to a timed step.
"""

from __future__ import annotations

import math
from typing import Any

from tunepilot.pilot.phases import PilotState, synchronize


def make_optimizer(model: Any, settings: Any, lr: float | None = None) -> Any:
    """The optimizer over the trainable parameters, as `train.loop.train` builds it."""
    from tunepilot.train.optimizer import build_optimizer

    return build_optimizer(model, settings, lr)


def longest_microbatches(data: list[Any], microbatch: int, accumulation: int) -> list[list[Any]]:
    """One update of the longest examples: `accumulation` microbatches of `microbatch`, the
    longest first, repeating the longest when the data has fewer examples than an update."""
    ordered = sorted(data, key=lambda e: len(e.input_ids), reverse=True)
    need = microbatch * accumulation
    picked = [ordered[i % len(ordered)] for i in range(need)]
    return [picked[i : i + microbatch] for i in range(0, need, microbatch)]


def train_update(
    state: PilotState,
    microbatches: list[list[Any]],
    optimizer: Any,
    lr: float,
    *,
    step: bool = True,
    keep_grads: bool = False,
) -> tuple[float, float]:
    """Forward + backward every microbatch with the loop's own normalisation, then clip and
    step like the loop (an update with a non-finite loss is not applied). Returns (loss, norm).
    `keep_grads` leaves the unclipped gradients in `.grad` (times the loss scale under fp16)
    and steps nothing.

    Under fp16 one GradScaler lives in `state.scaler` for the whole pilot, exactly as the loop
    keeps one per run: backward on the scaled loss, unscale before clipping, a step skipped
    when fp16 gradients overflowed, the scale updated every update. A fresh scaler per update
    would never grow or back off, and the pilot would time a different step (S3).

    The shape is recorded in `state.shape` first, so an out-of-memory error names it (S6).
    """
    from contextlib import nullcontext

    from tunepilot.train.batching import collate, count_targets
    from tunepilot.train.loop import backward_update
    from tunepilot.train.loss import kernel_that_runs
    from tunepilot.train.optimizer import update_norm
    from tunepilot.train.precision import autocast_and_scaler

    kind, device, model = state.kind, state.device, state.model
    state.shape = {
        "microbatch": max(len(mb) for mb in microbatches),
        "length": max(len(e.input_ids) for mb in microbatches for e in mb),
        "accumulation": len(microbatches),
    }
    autocast, fresh = autocast_and_scaler(state.training.precision, device)
    kernel = kernel_that_runs(state.training.loss_kernel, getattr(device, "type", str(device)))
    if state.scaler is None:
        state.scaler = fresh
    scaler = state.scaler
    batches = [
        {k: v.to(device) for k, v in collate(mb, kind, state.pad_id, state.packing).items()}
        for mb in microbatches
    ]
    if state.packing is not None:  # the packed rows really run: m examples in <= m rows (S6)
        state.shape.update(rows=max(b["input_ids"].shape[0] for b in batches),
                           length=max(b["input_ids"].shape[1] for b in batches))  # fmt: skip
    if state.hooks.before_forward is not None:
        state.hooks.before_forward(state.phase)
    targets = sum(count_targets(b, kind) for b in batches)
    for group in optimizer.param_groups:  # before backward: the step may run inside it
        group["lr"] = lr
    # With the step in backward, a pass that must not step (or must keep its gradients)
    # turns the per-parameter hooks off (in_backward.py); other optimizers step below.
    in_backward = hasattr(optimizer, "deferred")
    deferred = keep_grads or not step or len(batches) > 1  # several microbatches: one step
    held = optimizer.deferred() if in_backward and deferred else nullcontext()
    with held:
        loss = backward_update(model, batches, kind, targets, autocast=autocast, scaler=scaler,
                               loss_chunks=state.training.loss_chunks, loss_kernel=kernel)
    loss = float(loss) / targets
    if keep_grads:
        synchronize(device)
        return loss, math.nan
    params = [p for p in model.parameters() if p.requires_grad]
    if scaler is not None:
        scaler.unscale_(optimizer)  # once per update, so clipping sees true gradients
    norm = float(update_norm(optimizer, params, state.training.max_grad_norm))
    applies = step and math.isfinite(loss) and (scaler is not None or math.isfinite(norm))
    if scaler is not None:
        if applies:
            scaler.step(optimizer)  # skipped when fp16 gradients overflowed
        scaler.update()
    elif applies:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    return loss, norm


def machine_load(device: Any, cpu_seconds: float) -> dict[str, Any]:
    """What says whether a step time was taken on a quiet machine: the process's CPU time per
    update next to the wall time, its threads, the load average and the usable cores."""
    import os

    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"step_cpu_seconds": cpu_seconds, "threads": torch.get_num_threads(),
            "load_average": load, "cpu_cores": cores, "device_type": device.type}  # fmt: skip


def timing_flag(measurements: dict[str, Any]) -> str:
    """The steady-step sentence's word on its own timing: "" on a quiet machine, else that it
    is noisy, why, and that the plan will not turn it into hours (issue 10 item 3)."""
    from tunepilot.sizing.timing import noise_of

    noisy = noise_of(measurements)
    return f"; timing NOISY ({noisy}): not used for hours" if noisy else ""
