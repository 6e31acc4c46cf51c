"""Which trained-weight dtypes, optimizers and optimizer placements go together (S2, S3).

One function, `optimizer_problems`, judges a `TrainingSettings`; the schema calls it, so every
command that reads a campaign (validate included) refuses the same combinations with the same
sentence. Each sentence names the keys and the fix. What needs the machine (bitsandbytes'
8-bit optimizers run on CUDA only) is judged where the device is known:
`train.optimizer.require_optimizer_backend`.
"""

from __future__ import annotations

from typing import Any

BITSANDBYTES_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit")


def optimizer_problems(t: Any) -> list[str]:
    """Sentences for every combination of `t` (TrainingSettings) that cannot train as asked."""
    problems = []
    if t.weights_dtype == "bf16" and t.precision == "fp16":
        problems.append(
            "training.weights_dtype=bf16 with training.precision=fp16: fp16 autocast over bf16 "
            "weights mixes two half formats and its GradScaler cannot unscale bf16 gradients; "
            "set training.precision=bf16 (or fp32: pure bf16 compute), or "
            "training.weights_dtype=fp32"
        )
    if t.optimizer_in_backward:
        if t.accumulation > 1:
            problems.append(
                f"training.optimizer_in_backward=true with training.accumulation="
                f"{t.accumulation}: the step runs as each gradient is ready, so there is no "
                "later microbatch to add to it; set training.accumulation=1 (raise "
                "training.microbatch for the same examples per update), or "
                "training.optimizer_in_backward=false"
            )
        if t.max_grad_norm is not None:
            problems.append(
                f"training.optimizer_in_backward=true with training.max_grad_norm="
                f"{t.max_grad_norm}: clipping needs the norm of every gradient before any "
                "step, and each parameter steps as soon as its own gradient exists; set "
                "training.max_grad_norm=null, or training.optimizer_in_backward=false"
            )
        if t.distributed.strategy != "none":
            problems.append(
                f"training.optimizer_in_backward=true with training.distributed.strategy="
                f"{t.distributed.strategy}: a parameter's hook fires when its local gradient "
                "is accumulated, before DDP's all-reduce or FSDP's reduce-scatter has averaged "
                "it over the ranks; set training.distributed.strategy=none, or "
                "training.optimizer_in_backward=false"
            )
        if t.precision == "fp16":
            problems.append(
                "training.optimizer_in_backward=true with training.precision=fp16: the "
                "GradScaler must see every gradient before it may skip an overflowed step; "
                "set training.precision=bf16, or training.optimizer_in_backward=false"
            )
    return problems
