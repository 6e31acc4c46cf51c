"""The nearest change that makes a card fit (L1, S3, S4, S6, B4): each candidate tried as a dry
run that was actually executed, never an estimate.

`CANDIDATES` is the one table of changes, nearest first (least change to the experiment):
each is a list of dotted `key=value` overrides, the phases it acts on and what it costs. The
search walks the table, tries a candidate only where it acts on a phase that does not fit (or
on a precision the card lacks), keeps it when the dry run with it shows that phase needing
less, and stops as soon as the card's verdict (`sizing.fit`, the one verdict) is PASS. Every
trial is a real dry run of the campaign with the overrides applied, announced on stderr, and
at most `MAX_TRIALS` of them are run, so `plan --gpu` stays responsive.

Never proposed: a shorter data.max_length (S6: a case that fits only after truncation that
changed the expected output is not the same experiment).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunepilot.sizing.fit import MIN_HEADROOM, TRAINING_PHASES, Fit, best_fit, machine_fits

MAX_TRIALS = 8
EVALUATION = ("evaluation",)
EVERY_PHASE = ("first step", "steady step", "evaluation", "checkpoint", "export")
PRECISION = ("precision",)  # acts on a precision the card lacks


@dataclass(frozen=True)
class Candidate:
    """One change: its values (each a list of overrides, nearest first), the phases it acts
    on, and what it costs the experiment."""

    name: str
    phases: tuple[str, ...]
    values: Callable[[Any], list[list[str]]]  # campaign -> candidate overrides
    cost: str


def _eval_batches(c: Any, fits: int | None = None) -> list[list[str]]:
    """The largest eval batch that fits the card (`sizing.eval_fit`, when the sheet knows it),
    then halvings below it."""
    n, out = c.training.eval_batch_size, []
    if fits is not None and 1 <= fits < n:
        n = fits
        out.append([f"training.eval_batch_size={n}"])
    while n > 1:
        n //= 2
        out.append([f"training.eval_batch_size={n}"])
    return out


def _microbatch_one(c: Any) -> list[list[str]]:
    t = c.training
    if t.microbatch <= 1:
        return []
    return [["training.microbatch=1", f"training.accumulation={t.microbatch * t.accumulation}"]]


def _fp16(c: Any) -> list[list[str]]:
    """fp16 for every source of bf16 compute: a bf16 autocast, a bf16 or 4-bit base (QLoRA
    computes in bf16); an unset base already loads fp32 where a card has no bf16."""
    out = ["training.precision=fp16"] if c.training.precision == "bf16" else []
    if c.model.base_dtype in ("bf16", "nf4", "int8"):
        out.append("model.base_dtype=fp16")
    return [out] if out else []


def _step_in_backward(c: Any) -> list[list[str]]:
    """Only where the campaign's own rules accept it as is (campaign.optimizer_rules): one
    microbatch per update already (so the examples per update stay), one process, no fp16."""
    from tunepilot.campaign.optimizer_rules import optimizer_problems

    t = c.training
    stepped = t.model_copy(update={"optimizer_in_backward": True, "max_grad_norm": None})
    if t.optimizer_in_backward or optimizer_problems(stepped):
        return []
    return [["training.optimizer_in_backward=true", "training.max_grad_norm=null"]]


def _when(test: Callable[[Any], bool], *overrides: str) -> Callable[[Any], list[list[str]]]:
    return lambda c: [list(overrides)] if test(c) else []


CANDIDATES: list[Candidate] = [
    Candidate("activation checkpointing", TRAINING_PHASES,
              _when(lambda c: not c.training.activation_checkpointing,
                    "training.activation_checkpointing=true"),
              "each update recomputes its forward (the sheet gives the FLOPs it adds)"),
    Candidate("a smaller evaluation batch", EVALUATION, _eval_batches,
              "more validation batches; the metrics are the same"),
    Candidate("microbatch 1 with the accumulation that keeps the examples per update",
              TRAINING_PHASES, _microbatch_one,
              "the same examples per update (S7), smaller and slower steps"),
    Candidate("training precision bf16", TRAINING_PHASES,
              _when(lambda c: c.training.precision == "fp32", "training.precision=bf16"),
              "other numerics: run it as a variant against the control (S3)"),
    Candidate("8-bit optimizer state", TRAINING_PHASES,
              _when(lambda c: c.training.optimizer == "adamw", "training.optimizer=adamw_8bit"),
              "bitsandbytes' 8-bit AdamW keeps the moments in 8 bits: other numerics, run it "
              "as a variant (S3); needs bitsandbytes on the card"),
    Candidate("bf16 trained weights", TRAINING_PHASES,
              _when(lambda c: c.training.weights_dtype == "fp32" and c.training.precision
                    != "fp16", "training.weights_dtype=bf16"),
              "pure bf16 training: an update smaller than a bf16 ulp of its weight is lost; "
              "a variant (S3)"),
    Candidate("the optimizer step in backward", TRAINING_PHASES, _step_in_backward,
              "no full set of gradients is ever held, and no gradient clipping: a variant "
              "(S3)"),
    Candidate("fp16 where the card has no bf16", PRECISION, _fp16,
              "fp16 autocast needs loss scaling, an fp16 base is another base precision (P1): "
              "other numerics, run it as a variant (S3)"),
    Candidate("a bf16 base", EVERY_PHASE,
              _when(lambda c: c.model.base_dtype == "fp32", "model.base_dtype=bf16"),
              "another base precision (P1): a variant, not the same experiment"),
    Candidate("a 4-bit base (QLoRA)", EVERY_PHASE,
              _when(lambda c: c.model.method == "lora" and c.model.base_dtype not in ("nf4",),
                    "model.base_dtype=nf4"),
              "another base precision (P1): a variant, not the same experiment; needs "
              "bitsandbytes for the card's backend, and each pass dequantizes the weights"),
]  # fmt: skip


@dataclass(frozen=True)
class Trial:
    """One executed dry run: the overrides tried and the card's verdict with them."""

    overrides: tuple[str, ...]
    verdict: str
    phase: str
    sentence: str

    def to_json(self) -> dict[str, Any]:
        return {"overrides": list(self.overrides), "verdict": self.verdict,
                "phase": self.phase, "sentence": self.sentence}  # fmt: skip


def _merged(kept: list[str], more: list[str]) -> list[str]:
    """`kept` with `more` on top; a key set twice keeps the later value."""
    out = {o.split("=", 1)[0]: o for o in kept}
    out.update({o.split("=", 1)[0]: o for o in more})
    return list(out.values())


def _worst(f: Fit, phases: tuple[str, ...], budget: float) -> tuple[int, float]:
    """What a candidate must lower: precisions missing, then the need over its phases."""
    if phases == PRECISION:
        return len(f.missing), 0.0
    need = max((v for k, v in f.need.items() if k in phases), default=0)
    return 0, max(0.0, need - budget)


def _acts(c: Candidate, f: Fit, budget: float) -> bool:
    if c.phases == PRECISION:
        return bool(f.missing)
    return not f.missing and any(f.need.get(k, 0) > budget for k in c.phases)


def nearest_change(card: Any, current: Fit, campaign: Any,
                   run: Callable[[list[str]], Any], *, limit: int = MAX_TRIALS,
                   eval_batch: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Walk `CANDIDATES` for `card` from its verdict `current`; `run(overrides)` executes the
    campaign's dry run with those overrides (at settings the card can run). Returns the
    overrides kept, whether the card then PASSes, every trial, and one sentence.
    `eval_batch`: the largest eval batch that fits the card (`sizing.eval_fit`), tried first."""
    from tunepilot.progress import start_line

    budget = card.memory_bytes * (1 - MIN_HEADROOM)  # the verdict's budget, context included
    kept: list[str] = []
    costs: dict[str, str] = {}
    trials: list[Trial] = []
    for candidate in CANDIDATES:
        if current.passes or len(trials) >= limit:
            break
        if not _acts(candidate, current, budget):
            continue
        tries = (_eval_batches(campaign, eval_batch) if candidate.values is _eval_batches
                 else candidate.values(campaign))  # fmt: skip
        for values in tries:
            if len(trials) >= limit:
                break
            tried = _merged(kept, values)
            start_line(f"{card.name}: trying {' '.join(tried)} (dry run {len(trials) + 1} of "
                       f"at most {limit})")  # fmt: skip
            found = best_fit(machine_fits(card, run(tried)))
            trials.append(Trial(tuple(tried), found.verdict, found.phase, found.sentence))
            if _worst(found, candidate.phases, budget) < _worst(current, candidate.phases,
                                                                budget):  # fmt: skip
                kept, current = tried, found
                costs[candidate.name] = candidate.cost
            if current.passes or not _acts(candidate, current, budget):
                break
    if current.passes:
        sentence = (f"with {' '.join(kept)} the {card.name} fits: {current.sentence} (a dry "
                    f"run of the campaign with these overrides; {len(trials)} tried)")  # fmt: skip
    else:
        sentence = (f"no change of the table makes the {card.name} fit within {len(trials)} "
                    f"dry runs (best: {current.sentence})")  # fmt: skip
    return {"fits": current.passes, "overrides": kept,
            "changes": [f"{name}: {cost}" for name, cost in costs.items()],
            "trials": [t.to_json() for t in trials], "sentence": sentence,
            "verdict": current.to_json()}  # fmt: skip
