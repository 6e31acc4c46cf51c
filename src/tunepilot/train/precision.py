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


def resolve_precision(
    requested: str | None, device_type: str, bf16_supported: bool | None = None
) -> tuple[str, str]:
    """(`training.precision` as a run on `device_type` uses it, a sentence saying why).

    Unset, it is bf16 on a CUDA card that has bf16 (`bf16_supported`; None asks this
    machine's card): fp32 matmuls run several times slower than bf16 ones there, and bf16
    needs no loss scaling. Elsewhere fp32: CPU runs stay bit-identical to earlier ones, and a
    card without bf16 (T4, V100) would need fp16 with a GradScaler, which is asked explicitly.
    """
    if requested is not None:
        return requested, f"training.precision={requested}"
    if device_type == "cuda":
        if bf16_supported is None:
            from tunepilot.model.base_dtype import cuda_has_bf16

            bf16_supported = cuda_has_bf16()
        if bf16_supported:
            return "bf16", ("training.precision unset: bf16 autocast, the default on a CUDA "
                            "card with bf16")
        return "fp32", ("training.precision unset: fp32 on a CUDA card without bf16 (set "
                        "training.precision=fp16 for fp16 autocast with loss scaling)")
    return "fp32", f"training.precision unset: fp32 on {device_type}"


def autocast_and_scaler(
    precision: str | None, device: torch.device
) -> tuple[Callable[[], Any], Any]:
    """(autocast factory, GradScaler or None) for `training.precision`, or InputError (S3)."""
    import torch

    precision, _ = resolve_precision(precision, device.type)
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
