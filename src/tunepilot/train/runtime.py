"""The switches a careful engineer sets for a run, set in one place and recorded (B2, S3).

`runtime_record` says what a run of these settings does on a device type: precision, trained
weights' dtype, optimizer and its kernel, TF32, how the input is fed and how often the host
waits for the device. It is written to every run's env.json (under "runtime", which the
backend comparison ignores: these are the campaign's choices, not the machine) and shown in
the dossier. `cuda_switches` sets the process-wide flags the loop needs for its duration:

* TF32 (`torch.backends.cuda.matmul.allow_tf32`, `torch.backends.cudnn.allow_tf32`): fp32
  matmuls and convolutions on tensor cores (an H100: ~495 dense TFLOPS instead of 67), with a
  10-bit mantissa in the products; `training.tf32: false` keeps full fp32.
* The rest is how the loop itself is written: fused AdamW on CUDA (`train.optimizer`),
  collation from pinned host memory with `non_blocking` copies and the next update prepared
  while the device works (`train.feed`), target counts taken on the host, and one host sync
  per update, where the loss and gradient norm are read together (`optimizer.host_values`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def on_this_machine(settings: Any, device_type: str | None = None) -> Any:
    """`settings` (TrainingSettings) with what it leaves unset resolved for this machine (or
    for `device_type`, the one a recorded run trained on): `training.precision` (bf16 on a
    CUDA card with bf16, else fp32), recorded as such. Compare resolves a variant the same way
    for each of its runs, so a choice the tool made is never mistaken for an override (V1)."""
    if settings.precision is not None:
        return settings
    from tunepilot.model.base_dtype import default_device_type
    from tunepilot.train.precision import resolve_precision

    precision, _ = resolve_precision(None, device_type or default_device_type())
    return settings.model_copy(update={"precision": precision})


def require_backends(model: Any, training: Any, device_type: str | None = None) -> None:
    """Refuse what this machine cannot train (exit 2, the key and the fix), before anything
    is recorded: an nf4/int8 base or a bitsandbytes optimizer anywhere but on CUDA, a loss
    kernel library that is not installed."""
    from tunepilot.model.base_dtype import default_device_type, require_quantization_backend
    from tunepilot.train.loss import check_kernel
    from tunepilot.train.optimizer import require_optimizer_backend

    device_type = device_type or default_device_type()
    if model.base_dtype:
        require_quantization_backend(model.base_dtype, device_type)
    require_optimizer_backend(training.optimizer, device_type)
    check_kernel(training.loss_kernel)


def runtime_record(settings: Any, device_type: str) -> dict[str, Any]:
    """What a run of `settings` (TrainingSettings) does on `device_type`, for env.json."""
    from tunepilot.train.loss import kernel_that_runs
    from tunepilot.train.optimizer import describe_optimizer

    cuda = device_type == "cuda"
    return {
        "device_type": device_type,
        "precision": settings.precision,
        "weights_dtype": settings.weights_dtype,
        "optimizer": describe_optimizer(settings, device_type),
        "optimizer_in_backward": settings.optimizer_in_backward,
        "tf32": bool(settings.tf32) if cuda else None,
        "loss": {"kernel": kernel_that_runs(settings.loss_kernel, device_type),
                 "chunks": settings.loss_chunks},  # a causal LM's (train.loss)
        "input": ("pinned host memory, non_blocking copies, next update collated while the "
                  "device works" if cuda else "collated on the host, next update prepared "
                  "before the loss is read"),  # fmt: skip
        "target_counts": "on the host, before the copy",
        "host_syncs_per_update": 1,
    }


@contextlib.contextmanager
def cuda_switches(settings: Any, device: Any) -> Iterator[None]:
    """TF32 on (unless `training.tf32: false`) while the loop runs on CUDA; restored after."""
    if getattr(device, "type", str(device)) != "cuda":
        yield
        return
    import torch

    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = bool(settings.tf32)
    torch.backends.cudnn.allow_tf32 = bool(settings.tf32)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def runtime_line(record: dict[str, Any] | None) -> str:
    """The dossier's one line for a run's runtime record ("" when the run has none)."""
    if not record:
        return ""
    tf32 = {True: "TF32 on", False: "TF32 off", None: "TF32 n/a"}[record.get("tf32")]
    return (f"{record.get('precision')} precision, {record.get('weights_dtype')} trained "
            f"weights, {record.get('optimizer')}; {tf32}; {record.get('host_syncs_per_update')} "
            f"host sync per update")  # fmt: skip
