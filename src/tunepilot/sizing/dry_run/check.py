"""Is the dry run right? The same step on real tensors, its tensor bytes measured (item 6).

The step the dry run sizes (`dry_run.measure.train_step`) runs on the campaign's real base,
built by `model.build` as a run builds it, on this device. The memory probe measures the
step's peak tensor bytes above what was live when it started: on CPU the PyTorch profiler's
allocation events (never RSS: the heap keeps freed pages), on CUDA the caching allocator's
`max_memory_allocated`, with reserved-minus-allocated reported as its own term. The dry run's
prediction of the same quantity is the phase's peak minus what was resident before it
(weights; the optimizer state from the second step on): gradients, activations and
temporaries (plus the optimizer state the first step allocates).

A check never says PASS on data that cannot show an error: when the probe has no tensor
counter, or the step adds too few bytes to tell an activation error from allocator noise,
the verdict is "cannot validate", with the reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunepilot.data.workspace import Workspace

MIN_VISIBLE_BYTES = 1024**2  # below this, allocator rounding and caches dominate
CANNOT_VALIDATE = "cannot validate"


@dataclass
class StepCheck:
    """Predicted vs measured bytes a step adds on top of the resident state."""

    phase: str
    inputs: dict[str, Any]
    predicted: int
    measured: int | None
    error: float | None  # (predicted - measured) / measured
    verdict: str  # "PASS" | "FAIL" | "cannot validate"
    sentence: str
    extra: dict[str, int | None] = field(default_factory=dict)  # e.g. reserved - allocated

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Regions:
    """The tracker interface `train_step` writes to; a real run has nothing to attribute."""

    region: str = "setup"


def check_steps(
    ws: Workspace, *, device: str = "cpu", tolerance: float = 0.05, **options: Any
) -> list[StepCheck]:
    """First and steady step: the dry run's prediction vs the step executed on `device`.

    `options` are `dry_run`'s (microbatch, max_length, activation_checkpointing, base_dtype;
    None or absent = the campaign's own).
    """
    import torch

    from tunepilot.measure.memory import MemoryProbe
    from tunepilot.model.build import apply_method, enable_activation_checkpointing, load_model
    from tunepilot.sizing.dry_run.config import architecture_config
    from tunepilot.sizing.dry_run.measure import train_step
    from tunepilot.sizing.dry_run.run import dry_run
    from tunepilot.sizing.dry_run.shape import Shape
    from tunepilot.train.optimizer import build_optimizer

    keys = ("microbatch", "max_length", "activation_checkpointing", "base_dtype")
    options = {k: options.get(k) for k in keys}
    predicted = dry_run(ws, **options, device=device)
    shape = Shape.from_campaign(ws, architecture_config(ws.campaign.model, ws.root),
                                **options, attention=None, device=device)  # fmt: skip
    loaded = load_model(ws.model_source, shape.kind, shape.settings, shape.label_names,
                        pad_token_id=getattr(ws.tokenizer, "pad_token_id", None),
                        device_type=device)  # fmt: skip
    model = apply_method(loaded, shape.settings, shape.training.weights_dtype)
    if shape.activation_checkpointing:
        enable_activation_checkpointing(model)
    model.to(device).train()
    optimizer = build_optimizer(model, shape.training, foreach=device == "cuda")
    vocab = int(getattr(model.config, "vocab_size", 2) or 2)
    probe = MemoryProbe.for_device(device, tensors=device == "cpu")
    counter = "tensors" if device == "cpu" else "allocated"
    checks = []
    torch.manual_seed(0)
    for name in ("first step", "steady step"):
        with probe.phase(name) as record:
            train_step(model, optimizer, shape, _Regions(), device, vocab)
        optimizer.zero_grad(set_to_none=True)
        extra: dict[str, int | None] = {}
        if device != "cpu":
            alloc, res = record.peak_bytes("allocated"), record.peak_bytes("reserved")
            extra["reserved - allocated at the peak"] = (res - alloc) if alloc and res else None
        checks.append(_judge(predicted.phase(name), record.peak_delta_bytes(counter), tolerance,
                             extra))  # fmt: skip
    return checks


def predicted_step_bytes(phase: Any) -> int:
    """What the phase adds above the state resident before it (the measured quantity)."""
    added = phase.gradients + phase.activations + phase.temporaries
    if phase.phase == "first step":
        added += phase.optimizer  # AdamW's state is allocated by the first step
    else:  # allocated once by the first step, resident afterwards
        added -= sum(v for k, v in phase.analytical.items() if "cuBLAS" in k)
    return added


def _judge(phase: Any, measured: int | None, tolerance: float,
           extra: dict[str, int | None]) -> StepCheck:  # fmt: skip
    from tunepilot.measure.memory import human_bytes

    predicted = predicted_step_bytes(phase)
    base = {"phase": phase.phase, "inputs": phase.inputs, "predicted": predicted,
            "measured": measured, "extra": extra}  # fmt: skip
    if measured is None:
        return StepCheck(**base, error=None, verdict=CANNOT_VALIDATE,
                         sentence="the probe has no tensor-byte counter here")  # fmt: skip
    if measured < MIN_VISIBLE_BYTES:
        return StepCheck(
            **base, error=None, verdict=CANNOT_VALIDATE,
            sentence=f"the step adds only {human_bytes(measured)} of tensors, too little to "
            "tell an activation error from allocator rounding; use a larger shape",
        )  # fmt: skip
    error = (predicted - measured) / measured
    verdict = "PASS" if abs(error) <= tolerance else "FAIL"
    sentence = (f"predicted {human_bytes(predicted)}, measured {human_bytes(measured)} "
                f"({error:+.1%}, tolerance {tolerance:.0%})")  # fmt: skip
    return StepCheck(**base, error=error, verdict=verdict, sentence=sentence)
