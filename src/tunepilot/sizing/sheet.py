"""Sizing a complete training step before renting (S1, S7, L1, L2).

Three pieces, each small enough to check by hand:
- `static_bytes`: what the trainable set costs whatever the input shape: weights, gradients,
  optimizer state and fp32 master copies (S1: precision, optimizer states and trainable
  parameters are part of the estimate).
- `fit_memory_model`: peaks measured at a few (microbatch, length) points, fitted as
  peak = fixed + a x tokens + b x tokens x length (tokens = microbatch x length; the quadratic
  term is attention scores), checked on a held-out point (`holdout_error`).
- `selection_sheet`: the configured shape and its alternatives on every catalog card, with
  headroom, in the order S6 proposes them; a configuration is recommended only when the
  software stack passed the pilot on that card's backend (L2).

Pure Python + numpy: no torch here, the measurements come from the memory probe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from tunepilot.errors import InputError, Problem, input_error
from tunepilot.measure.memory import human_bytes
from tunepilot.sizing.catalog import GpuCard
from tunepilot.sizing.memory_model import (  # noqa: F401  (re-exported: one import for the sheet)
    HoldoutCheck,
    MemoryModel,
    fit_memory_model,
    holdout_error,
    measure_memory_grid,
)
from tunepilot.train.arithmetic import plan_updates

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Optimizer state per trainable parameter, kept in fp32: AdamW = exp_avg + exp_avg_sq.
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd": 0, "sgd_momentum": 4, "adamw_8bit": 2}
# Assumptions, stated in the sheet: CUDA context + allocator cache outside tensor counters,
# and the share of activation memory that activation checkpointing keeps (layer inputs plus
# one layer recomputed at a time). Measure the S3 row before relying on the second one.
DEFAULT_OVERHEAD_BYTES = 1024**3
CHECKPOINTING_KEEPS = 0.3


@dataclass(frozen=True)
class StaticBytes:
    """Bytes that do not depend on the input shape (S1), per replica before any sharding."""

    weights: int
    gradients: int
    optimizer_state: int
    master_weights: int
    sentence: str

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer_state + self.master_weights

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


def static_bytes(
    n_params_total: int,
    n_trainable: int,
    precision: str,
    optimizer: str = "adamw",
    *,
    weights_dtype: str | None = None,
    master_weights: bool | None = None,
) -> StaticBytes:
    """Weights (all), gradients (trainable only), optimizer state and master copies.

    tunepilot's loop keeps weights in fp32 and applies bf16/fp16 through autocast, so by
    default (`weights_dtype=None`) precision saves activation memory, not static memory.
    Storing weights in half precision (`weights_dtype="bf16"`) halves weights and gradients,
    and then the trainable set needs fp32 master copies (default on for half weights).
    """
    problems = [
        Problem(f"training.{key}", f"`{value}`", f"use one of {list(allowed)}")
        for key, value, allowed in (
            ("precision", precision, DTYPE_BYTES),
            ("weights_dtype", weights_dtype or "fp32", DTYPE_BYTES),
            ("optimizer", optimizer, OPTIMIZER_STATE_BYTES),
        )
        if value not in allowed
    ]
    if not 0 <= n_trainable <= n_params_total:
        problems.append(Problem("model", f"{n_trainable:,} trainable of {n_params_total:,}",
                                "count trainable parameters within the total"))  # fmt: skip
    if problems:
        raise InputError(problems, title="cannot size the static bytes")
    wdtype = weights_dtype or "fp32"
    half = DTYPE_BYTES[wdtype] < 4
    keep_master = half if master_weights is None else master_weights
    w = n_params_total * DTYPE_BYTES[wdtype]
    g = n_trainable * DTYPE_BYTES[wdtype]
    o = n_trainable * OPTIMIZER_STATE_BYTES[optimizer]
    m = n_trainable * 4 if keep_master else 0
    sentence = (
        f"{n_params_total:,} weights in {wdtype} ({human_bytes(w)}) + gradients for "
        f"{n_trainable:,} trainable ({human_bytes(g)}) + {optimizer} state "
        f"({human_bytes(o)})"
        + (f" + fp32 master copies ({human_bytes(m)})" if m else "")
        + f" = {human_bytes(w + g + o + m)} before activations, computed in {precision}."
    )
    return StaticBytes(w, g, o, m, sentence)


# --------------------------------------------------------------------------------------------
# the memory model
# --------------------------------------------------------------------------------------------

Point = tuple[int, int, float]  # (microbatch, length, peak bytes)


def updates_sheet(
    n_examples: int,
    microbatch: int,
    accumulation: int,
    replicas: int = 1,
    *,
    updates: int | None = None,
    epochs: float | None = None,
    drop_last: bool = False,
) -> dict[str, Any]:
    """S7: examples per update, updates per epoch, examples seen; what is held and what follows."""
    plan = plan_updates(n_examples, microbatch, accumulation, replicas, updates=updates,
                        epochs=epochs, drop_last=drop_last)  # fmt: skip
    follows = "epochs and examples seen" if plan.held == "updates" else "updates"
    return {
        **plan.to_json(),
        "follows": follows,
        "rule": "examples per update = microbatch x accumulation x data replicas; model "
        "parallelism does not multiply it. Holding updates fixed while changing the batch "
        "changes examples seen; holding epochs fixed changes updates (S7).",
    }


# --------------------------------------------------------------------------------------------
# the selection sheet (L1, L2)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One configuration to size: a row of the selection sheet."""

    label: str
    microbatch: int
    accumulation: int
    precision: str
    checkpointing: bool
    strategy: str  # "none", "ddp", "fsdp"
    world_size: int


def _alternatives(base: Shape, gpu_counts: Sequence[int]) -> list[Shape]:
    """The configured shape, then S6's order: smaller microbatch with more accumulation (same
    effective batch), activation checkpointing, lower precision, more GPUs (DDP, FSDP)."""
    rows = [base]
    effective = base.microbatch * base.accumulation
    mb = base.microbatch // 2
    while mb >= 1:
        if effective % mb == 0:
            label = f"microbatch {mb} x accumulation {effective // mb}"
            rows.append(replace(base, label=label, microbatch=mb, accumulation=effective // mb))
        mb //= 2
    if not base.checkpointing:
        rows.append(replace(base, label="activation checkpointing", checkpointing=True))
    if base.precision == "fp32":
        rows.append(replace(base, label="bf16 autocast", precision="bf16"))
    if base.strategy == "none" and base.world_size == 1:
        for n in gpu_counts:
            # Keep the effective batch when the accumulation divides; otherwise it grows (S7).
            acc = base.accumulation // n if base.accumulation % n == 0 else base.accumulation
            for strategy in ("ddp", "fsdp"):
                label = f"{strategy.upper()} x {n} GPUs"
                rows.append(replace(base, label=label, accumulation=acc, strategy=strategy,
                                    world_size=n))  # fmt: skip
    return rows


def _activation_scale(
    shape: Shape, measured_precision: str, measured_checkpointing: bool
) -> tuple[float, list[str]]:
    """Factor from the measured activations to this shape's, and why that is an estimate."""
    factor, why = 1.0, []
    if shape.precision != measured_precision:
        factor *= DTYPE_BYTES[shape.precision] / DTYPE_BYTES[measured_precision]
        why.append(f"activations measured in {measured_precision}, scaled to {shape.precision}")
    if shape.checkpointing and not measured_checkpointing:
        factor *= CHECKPOINTING_KEEPS
        why.append(f"checkpointing assumed to keep {CHECKPOINTING_KEEPS:.0%} of activations")
    return factor, why


def _recommend(
    rows: list[dict[str, Any]], targets: list[GpuCard], stack_checked: bool, backend: str | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str]:
    """(candidate, recommendation, sentence): the first row in S6's order that fits one of
    `targets` with headroom, the slowest such card first (slower cards rent for less; the
    rental plan then prices the time); recommended only under L2.

    DDP rows use as much memory per GPU as the configured one, so they never rescue a shape
    that does not fit; they are for speed and are skipped here.
    """
    targets = sorted(targets, key=lambda c: (c.relative_speed, c.memory_gib))
    candidate = None
    for row in rows:
        if row["strategy"] == "ddp" and row["label"] != "configured":
            continue
        card = next((c for c in targets if row["fits"][c.name]["verdict"] == "PASS"), None)
        if card is not None:
            headroom = row["fits"][card.name]["headroom"]
            candidate = {"row": row["label"], "card": card.name, "backend": card.backend,
                         "headroom": headroom}  # fmt: skip
            break
    if candidate is None:
        return None, None, "no configuration fits a card of the catalog with the headroom asked"
    if not stack_checked:
        return candidate, None, (
            "not recommended yet: the environment and step gates have not passed on this "
            "backend; run `tunepilot pilot` until they do (L2)"
        )  # fmt: skip
    if backend is not None and backend != candidate["backend"]:
        return candidate, None, (
            f"not recommended yet: the stack was checked on {backend}, not on "
            f"{candidate['backend']}; run `tunepilot pilot` on the {candidate['card']} before "
            "the campaign (B1, L2)"
        )  # fmt: skip
    return candidate, candidate, (
        f"{candidate['row']} on {candidate['card']}: it fits with {candidate['headroom']:.0%} "
        f"headroom and the stack passed on {backend or candidate['backend']}"
    )  # fmt: skip


def selection_sheet(
    *,
    n_params_total: int,
    n_trainable: int,
    memory_model: MemoryModel,
    microbatch: int,
    max_length: int,
    accumulation: int,
    precision: str,
    expected_result: str,
    cards: Sequence[GpuCard],
    stack_checked: bool,
    checked_backend: str | None = None,
    strategy: str = "none",
    world_size: int = 1,
    activation_checkpointing: bool = False,
    optimizer: str = "adamw",
    measured_precision: str = "fp32",
    min_headroom: float = 0.10,
    overhead_bytes: int = DEFAULT_OVERHEAD_BYTES,
    gpu: str | None = None,
    gpu_counts: Sequence[int] = (2, 4, 8),
    measured_on: str = "cpu",
) -> dict[str, Any]:
    """L1: the sheet for the configured shape and its alternatives on every card.

    Predicted peak per GPU = static bytes (divided by world size under FSDP) + activations
    from the fitted model (scaled to the precision) + `overhead_bytes`. The fitted fixed part
    is reported but not used: it holds the measuring machine's runtime (the whole process on
    CPU), while the bytes model holds on any card. The memory model is
    taken as measured at the configured checkpointing and `measured_precision`, on
    `measured_on` ("cpu" or a card name): a CPU-measured row is labelled an estimate.
    `stack_checked`: the environment and step gates passed; a row is recommended only then,
    and only on a card of `checked_backend` (L2, B1: another backend means another pilot).
    """
    targets = [c for c in cards if gpu is None or c.name.lower() == gpu.lower()]
    if not targets:
        names = ", ".join(c.name for c in cards)
        raise input_error("rental.gpu", f"no card `{gpu}` in the catalog", f"use one of {names}")
    static = static_bytes(n_params_total, n_trainable, precision, optimizer)
    base = Shape("configured", microbatch, accumulation, precision, activation_checkpointing,
                 strategy, world_size)  # fmt: skip
    rows = []
    for shape in _alternatives(base, gpu_counts):
        # FSDP shards weights, gradients and optimizer state; DDP keeps a full replica each.
        per_gpu = static.total // shape.world_size if shape.strategy == "fsdp" else static.total
        factor, why = _activation_scale(shape, measured_precision, activation_checkpointing)
        if measured_on == "cpu":
            why.insert(0, "activations measured as CPU RSS, not by a GPU allocator")
        act = memory_model.activation_bytes(shape.microbatch, max_length) * factor
        peak = per_gpu + act + overhead_bytes
        replicas = shape.world_size if shape.strategy in ("ddp", "fsdp") else 1
        rows.append({
            **asdict(shape), "estimate": "; ".join(why),
            "examples_per_update": shape.microbatch * shape.accumulation * replicas,
            "static_bytes_per_gpu": per_gpu, "activation_bytes": int(act),
            "overhead_bytes": overhead_bytes, "peak_bytes_per_gpu": int(peak),
            "fits": {c.name: c.fit(peak, min_headroom, shape.precision, shape.world_size)
                     for c in cards},
        })  # fmt: skip
    # The largest microbatch whose activations fit at the longest length, per card.
    per_example = memory_model.activation_bytes(1, max_length)
    per_example *= _activation_scale(base, measured_precision, activation_checkpointing)[0]
    fixed = rows[0]["static_bytes_per_gpu"] + overhead_bytes
    max_mb = {c.name: max(0, int((c.memory_bytes * (1 - min_headroom) - fixed) // per_example))
              if per_example > 0 else None for c in cards}  # fmt: skip
    candidate, recommendation, why = _recommend(rows, targets, stack_checked, checked_backend)
    return {
        **{k: v for k, v in asdict(base).items() if k != "label"},
        "memory_per_gpu": {c.name: c.memory_bytes for c in cards},
        "max_dims": {"length": max_length, "microbatch": microbatch,
                     "max_microbatch_at_length": max_mb},
        "expected_result": expected_result,
        "static_bytes": static.to_json(), "memory_model": memory_model.to_json(),
        "min_headroom": min_headroom, "rows": rows, "candidate": candidate,
        "recommendation": recommendation, "recommendation_sentence": why,
        "stack_checked": stack_checked, "checked_backend": checked_backend,
        "measured_on": measured_on,
        "assumptions": [
            f"{human_bytes(overhead_bytes)} per GPU for the CUDA context and allocator cache",
            "weights stay fp32 under bf16/fp16 autocast (tunepilot's loop)",
            f"activation checkpointing keeps ~{CHECKPOINTING_KEEPS:.0%} of activations",
            f"activations measured in {measured_precision} scale with bytes per value",
        ],
    }  # fmt: skip
