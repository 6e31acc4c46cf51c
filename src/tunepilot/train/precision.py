"""Precision for a training step (S3): an autocast factory and, for fp16, a GradScaler.

One function the loop and the pilot share, so the pilot measures exactly what training runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tunepilot.errors import input_error

if TYPE_CHECKING:
    import torch


def autocast_and_scaler(precision: str, device: torch.device) -> tuple[Callable[[], Any], Any]:
    """(autocast factory, GradScaler or None) for `training.precision`, or InputError (S3)."""
    import torch

    if precision == "fp32":
        return contextlib.nullcontext, None
    if precision == "bf16":
        return (lambda: torch.autocast(device.type, dtype=torch.bfloat16)), None
    if device.type != "cuda":
        raise input_error(
            "training.precision",
            f"fp16 on {device.type}; fp16 training with a GradScaler is supported on CUDA only",
            "use training.precision=bf16 (or fp32) here; keep fp16 for NVIDIA GPUs",
            title="precision not available",
        )
    return (lambda: torch.autocast("cuda", dtype=torch.float16)), torch.amp.GradScaler("cuda")
