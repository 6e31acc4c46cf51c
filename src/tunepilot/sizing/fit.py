"""Does the campaign fit this card? The one verdict `size`, `plan`, the sheet, the
recommendation and the nearest-change search all call (L1, L2, S4, B3, B4).

A card's verdict is made from a dry run of the campaign's step *at settings the card can
run*, phase by phase:

- every phase (first step, steady step, evaluation, checkpoint, export) must fit one GPU's
  memory with `MIN_HEADROOM` of it left free, the device context included; the phase with the
  highest need decides the peak and is named;
- the card must compute in every precision the step's operators compute in (the dry run's
  FLOPs split: a bf16 base or bf16 autocast needs bf16, which a T4 lacks); a missing one is a
  FAIL whatever the memory;
- PASS: everything fits with the headroom; WARN: it fits with less (the caching allocator's
  free blocks live there, so no package is planned on it); FAIL otherwise. Only a PASS gets
  hours, a package or a cost.

A machine of several GPUs runs the campaign as the engine can (`Layout`): one run per GPU side
by side (each GPU holds the single-GPU step), one run over all of them with DDP (a full
replica per GPU plus its gradient buckets) or with FSDP (weights, gradients and optimizer
state sharded, one block gathered at a time). Those per-GPU bytes are arithmetic on the dry
run's split, stated as such; which fitting layout is faster is the plan's choice
(`sizing.machine`).

Importing this module imports nothing heavy; it reads a `DryRun` and never builds one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tunepilot.measure.memory import human_bytes
from tunepilot.sizing.catalog import GpuCard
from tunepilot.sizing.dry_run.fsdp import outer_unit_bytes

MIN_HEADROOM = 0.10
"""Share of each card kept free: the caching allocator's reserved-but-free blocks live there
(a pilot on the card measures reserved minus allocated)."""
TRAINING_PHASES = ("first step", "steady step")
SINGLE, SIDE_BY_SIDE, DDP, FSDP = "one GPU", "side by side", "ddp", "fsdp"


@dataclass(frozen=True)
class Layout:
    """How a machine runs the campaign: `kind` over `gpus` GPUs."""

    kind: str  # SINGLE | SIDE_BY_SIDE | DDP | FSDP
    gpus: int = 1

    @property
    def label(self) -> str:
        return {SINGLE: "one GPU", SIDE_BY_SIDE: f"{self.gpus} runs side by side, one per GPU",
                DDP: f"DDP over {self.gpus}",
                FSDP: f"FSDP over {self.gpus}"}[self.kind]  # fmt: skip

    @property
    def replicas(self) -> int:
        """Data replicas of one run (S7: they multiply the examples per update)."""
        return self.gpus if self.kind in (DDP, FSDP) else 1


def layouts(card: GpuCard) -> list[Layout]:
    """The ways a machine of `card.gpus` GPUs can run the campaign."""
    if card.gpus == 1:
        return [Layout(SINGLE, 1)]
    return [Layout(SIDE_BY_SIDE, card.gpus), Layout(DDP, card.gpus), Layout(FSDP, card.gpus)]


def per_gpu_bytes(dry: Any, layout: Layout) -> dict[str, int]:
    """Tensor bytes per GPU of every phase under `layout` (the device context excluded).

    DDP adds its gradient buckets (a flat fp32 copy of every trained weight's gradient,
    allocated when the model is wrapped and held throughout: trained weights are fp32) to a
    full replica; FSDP keeps 1/N of the weights, gradients and optimizer state of each phase's
    peak moment, gathers one block's weights at a time, and keeps the unit outside the blocks
    (embeddings, final norm, head) gathered through the step (`dry_run.fsdp.outer_unit_bytes`).
    Arithmetic on the dry run's split.
    """
    out = {}
    for p in dry.phases:
        if layout.kind == DDP:
            out[p.phase] = int(p.peak + 4 * dry.trainable_params)
        elif layout.kind == FSDP:
            state = p.weights + p.gradients + p.optimizer
            block = p.weights // max(1, dry.layers)
            outer = outer_unit_bytes(dry, p.weights)
            out[p.phase] = int(p.peak - state + math.ceil(state / layout.gpus) + block
                               + outer - outer // layout.gpus)  # fmt: skip
        else:
            out[p.phase] = int(p.peak)
    return out


def precisions_needed(dry: Any) -> list[str]:
    """Every precision the step's operators compute in, over all phases (the FLOPs split)."""
    found = {k for p in dry.phases for k, v in (p.flops_by or {}).items() if v}
    return sorted(found)


def resolved_base(card: GpuCard, configured: str | None) -> str:
    """The base dtype a run loads on `card`: the configured one, else bf16 where the card has
    it and fp32 where it does not (`model.base_dtype.resolve_base_dtype` on that device)."""
    if configured is not None:
        return configured
    return "bf16" if card.bf16 else "fp32"


@dataclass(frozen=True)
class Fit:
    """One card's verdict under one layout: the bytes each phase needs per GPU (device context
    included), the phase that decides, the headroom left, and one sentence."""

    card: str
    layout: Layout
    verdict: str  # "PASS" | "WARN" | "FAIL"
    headroom: float
    need: dict[str, int]
    phase: str  # the phase with the highest need
    sentence: str
    missing: list[str] = field(default_factory=list)  # precisions the card lacks

    @property
    def passes(self) -> bool:
        return self.verdict == "PASS"

    @property
    def peak_bytes(self) -> int:
        return self.need[self.phase]

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "peak_bytes": self.peak_bytes,
                "headroom": round(self.headroom, 4), "sentence": self.sentence,
                "phase": self.phase, "need_by_phase": dict(self.need),
                "layout": self.layout.label, "layout_kind": self.layout.kind,
                "missing_precisions": list(self.missing)}  # fmt: skip


def fit(card: GpuCard, dry: Any, layout: Layout | None = None) -> Fit:
    """THE verdict of `dry` (a dry run at settings `card` can run) on `card` under `layout`
    (default: the machine's first layout, one GPU for a single card)."""
    layout = layout or layouts(card)[0]
    context = int(dry.cuda_context_bytes)
    need = {k: v + context for k, v in per_gpu_bytes(dry, layout).items()}
    phase = max(need, key=lambda k: need[k])
    headroom = 1.0 - need[phase] / card.memory_bytes
    missing = [p for p in precisions_needed(dry) if card.peak_flops(p) is None]
    per = f" per GPU under {layout.label}" if card.gpus > 1 else ""
    if missing:
        verdict = "FAIL"
        sentence = (f"the {card.name} has no {', '.join(missing)} (see its datasheet), which "
                    "the step computes in (training.precision or model.base_dtype)")  # fmt: skip
    elif headroom >= MIN_HEADROOM:
        verdict, sentence = "PASS", f"fits with {headroom:.0%} headroom{per} ({phase} decides)"
    elif headroom >= 0:
        verdict = "WARN"
        sentence = (f"fits with only {headroom:.0%} headroom{per}, under the {MIN_HEADROOM:.0%} "
                    f"kept free ({phase} decides)")  # fmt: skip
    else:
        verdict = "FAIL"
        over = [k for k, v in need.items() if v > card.memory_bytes * (1 - MIN_HEADROOM)]
        short = human_bytes(need[phase] - card.memory_bytes)
        sentence = (f"{phase} needs {human_bytes(need[phase])}{per}, {short} more than the "
                    f"{card.name} has; over the budget: {', '.join(over)}")  # fmt: skip
    return Fit(card.name, layout, verdict, headroom, need, phase, sentence, missing)


def machine_fits(card: GpuCard, dry: Any) -> list[Fit]:
    """The verdict under each way the machine can run the campaign (one for a single GPU)."""
    return [fit(card, dry, layout) for layout in layouts(card)]


def best_fit(fits: list[Fit]) -> Fit:
    """The fit a row shows when no layout is chosen for speed: the first that passes, else the
    one with the most headroom."""
    passing = [f for f in fits if f.passes]
    return passing[0] if passing else max(fits, key=lambda f: (f.verdict == "WARN", f.headroom))
