"""One phase of the dry run: its peak live bytes split by what holds them, and its FLOPs.

Shared by the dry run's driver (`dry_run/run.py`) and its measurement (`dry_run/measure.py`), so
neither imports the other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PHASES = ("first step", "steady step", "evaluation", "checkpoint", "export")
MIB = 1024**2
CUBLAS_WORKSPACE = 32 * MIB  # PyTorch's default cuBLAS workspace on Hopper (:4096:8)
CUDA_CONTEXT = 512 * MIB  # assumption: CUDA context + kernels, outside torch's allocator


@dataclass
class PhaseSize:
    """One phase's peak live bytes per GPU (world size 1), split by what holds them."""

    phase: str  # "first step" | "steady step" | "evaluation" | "checkpoint" | "export"
    weights: int
    gradients: int
    optimizer: int
    activations: int
    temporaries: int
    peak: int  # live bytes at the phase's peak moment (the sum of the five at that moment)
    flops: int  # one microbatch fwd+bwd for steps; the forward for evaluation; 0 for save
    inputs: dict[str, Any]  # microbatch, length, base_dtype, activation_checkpointing, attention
    notes: list[str] = field(default_factory=list)
    analytical: dict[str, int] = field(default_factory=dict)  # added terms, bytes, by name
    flops_by: dict[str, int] = field(default_factory=dict)  # FLOPs per compute precision
    # Paged optimizer state (bitsandbytes' paged 8-bit AdamW) in CUDA unified memory: outside
    # the allocator and never in `peak`; on the GPU while there is room, else in host RAM.
    host_paged: int = 0

    def flops_by_precision(self, fallback: str) -> dict[str, int]:
        """FLOPs per precision ("bf16", "fp32", ...); all in `fallback` when not split."""
        return dict(self.flops_by) if self.flops_by else {fallback: self.flops}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
