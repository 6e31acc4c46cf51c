"""Each S3 option sized on the phase it changes, from dry runs of both settings (S3, S4).

The highest phase of a step can hide an option's effect: with a large evaluation batch, the
peak over all phases is evaluation's, and switching activation checkpointing on leaves it
where it was although the training step lost most of its activations. So each option is
judged on its own phase, and the sheet says separately which phase decides the peak:

- activation checkpointing: the training step's peak (first and steady step), and the FLOPs
  it adds (the recomputed forward);
- training precision: the training step's peak, and each precision's FLOPs at its dense peak;
- the evaluation batch: the evaluation phase's peak at the configured batch and at 1.
"""

from __future__ import annotations

import math
from typing import Any

from tunepilot.measure.memory import human_bytes
from tunepilot.sizing.fit import TRAINING_PHASES


def training_peak(dry: Any) -> int:
    """The training step's peak: the larger of the first and the steady step."""
    return max(int(p.peak) for p in dry.phases if p.phase in TRAINING_PHASES)


def phase_peak(dry: Any, name: str) -> int:
    return int(next(p.peak for p in dry.phases if p.phase == name))


def steady_flops(dry: Any) -> int:
    return int(next(p.flops for p in dry.phases if p.phase == "steady step"))


def checkpointing_effect(off: Any, on: Any, microbatch: int) -> dict[str, Any]:
    """Activation checkpointing off and on at the configured microbatch (dry runs of both)."""
    out: dict[str, Any] = {}
    for key, dry in (("off", off), ("on", on)):
        out[key] = {"training_peak": training_peak(dry), "peak_bytes": int(dry.peak().peak),
                    "peak_phase": dry.peak().phase, "steady_flops": steady_flops(dry)}  # fmt: skip
    saved = out["off"]["training_peak"] - out["on"]["training_peak"]
    base = out["off"]["steady_flops"]
    extra = out["on"]["steady_flops"] / base - 1 if base else math.nan
    whole = ""
    if out["on"]["peak_phase"] not in TRAINING_PHASES:
        whole = (f"; the whole step's peak stays {human_bytes(out['on']['peak_bytes'])} with it: "
                 f"{out['on']['peak_phase']} decides it, which checkpointing does not change")
    out["sentence"] = (
        f"activation checkpointing at microbatch {microbatch}, on the training step: "
        f"{human_bytes(out['off']['training_peak'])} without, "
        f"{human_bytes(out['on']['training_peak'])} with ({human_bytes(saved)} saved); the "
        f"step computes {extra:+.0%} FLOPs (the recomputed forward), so each update takes "
        f"that much longer{whole} (dry runs of both, S3)"
    )
    return out


def eval_batch_effect(configured: Any, at_one: Any, eval_batch: int) -> dict[str, Any]:
    """The evaluation phase at the configured eval batch and at 1 (dry runs of both)."""
    mine, one = phase_peak(configured, "evaluation"), phase_peak(at_one, "evaluation")
    decides = configured.peak().phase
    return {
        "eval_batch_size": eval_batch, "peak_bytes": {eval_batch: mine, 1: one},
        "decides": decides == "evaluation",
        "sentence": (
            f"training.eval_batch_size {eval_batch}, on evaluation: {human_bytes(mine)}; at 1: "
            f"{human_bytes(one)} (dry runs of both); evaluation "
            + ("decides the peak of the configured step" if decides == "evaluation"
               else f"does not decide the peak ({decides} does)") + " (S4)"
        ),
    }  # fmt: skip


def precision_effect(
    configured: tuple[Any, Any], alt: tuple[Any, Any], precision: str, other: str,
    catalog: Any,
) -> dict[str, Any]:  # fmt: skip
    """The configured precision against the other one, each a (dry run, WorkFlops): the
    training step's peak, and per card the update's time with the other over its time as
    configured (each precision's FLOPs at that precision's dense peak; a card lacking one
    gives None)."""
    from tunepilot.sizing.timing import WorkBytes, computed_seconds

    none = WorkBytes(0, 0, 0)

    def update_seconds(card: Any, flops: Any) -> float | None:
        found = computed_seconds(card, catalog, flops, none)
        return found.update if found is not None else None

    speed = {}
    for c in catalog.cards:
        mine_s, theirs_s = update_seconds(c, configured[1]), update_seconds(c, alt[1])
        speed[c.name] = mine_s / theirs_s if mine_s and theirs_s else None
    mine, theirs = training_peak(configured[0]), training_peak(alt[0])
    shown = [f"{k} x{1 / v:.2f}" for k, v in speed.items() if v][:3]
    return {
        "configured": precision, "other": other, "peak_bytes": {precision: mine, other: theirs},
        "peak_speedup": speed,
        "flops_shares": {precision: configured[1].shares(), other: alt[1].shares()},
        "sentence": (
            f"training.precision {precision}, on the training step: {human_bytes(mine)}, FLOPs "
            f"{configured[1].shares()}; {other}: {human_bytes(theirs)}, FLOPs "
            f"{alt[1].shares()} (dry runs of both, autocast's casts replayed); time per update "
            f"with {other} relative to {precision}, each precision's FLOPs at its dense peak: "
            + ", ".join(shown) + " (S3)"
        ),
    }  # fmt: skip
