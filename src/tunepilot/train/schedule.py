"""Learning-rate schedules as a pure function of the update index (R1).

A `LambdaLR` keeps its own counter, which then has to be saved, restored and kept in step with
the optimizer. Here the learning rate of an update is computed from its index alone, so
resume needs nothing but the update count already in state.json, and the sizing sheet can
print the curve without building an optimizer.

Warmup ramps linearly so that the first update already moves (lr / warmup, not 0: an update
at lr 0 spends compute and changes nothing) and update `warmup` reaches the peak. Decay then
runs from the peak towards 0 over the remaining updates; the last update keeps a small
positive lr rather than exactly 0 for the same reason.
"""

from __future__ import annotations

import math
from typing import Any


def lr_factor(update: int, scheduler: str, warmup: int, total_updates: int) -> float:
    """Multiplier of the peak lr for the update with 0-based index `update`."""
    if update < 0:
        raise ValueError(f"update index {update} is negative")
    if update < warmup:
        return (update + 1) / warmup
    if scheduler == "constant":
        return 1.0
    decay_updates = max(1, total_updates - warmup)
    progress = min(1.0, (update - warmup) / decay_updates)
    if scheduler == "linear":
        return 1.0 - progress
    if scheduler == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown scheduler {scheduler!r}; use constant, linear or cosine")


def lr_at(update: int, settings: Any, total_updates: int) -> float:
    """The learning rate for update `update` (0-based) under a campaign's TrainingSettings."""
    factor = lr_factor(update, settings.scheduler, settings.warmup_updates, total_updates)
    return settings.lr * factor
