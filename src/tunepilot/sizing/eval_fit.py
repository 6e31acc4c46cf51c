"""The evaluation batch a card can run (L1, S1, V2): the one place that decides it.

Evaluation has no gradients, optimizer state or backward; at a fixed length its peak is the
resident weights plus activations, KV cache and the loss's chunks, each linear in the batch.
Two dry runs the sheet already makes (eval batch 1 and the configured one) give that line
exactly, so the largest batch that fits a card follows without another dry run:

* `largest_eval_batch` is THE verdict: the largest batch, at most the configured one, whose
  evaluation need (context included) stays within the card's budget (`sizing.fit`'s headroom
  policy); 0 when even one example does not fit;
* `card_setting` applies it to a card's row when `training.eval_batch_size` is unset: the card
  is sized, and its package run, at that batch (one dry run of it confirms the verdict); a
  value the user set is kept and judged as it is (the nearest-change search then proposes the
  largest that fits, from the same function).

The batch is one campaign-wide setting (`training.eval_batch_size` is fixed for every variant,
V2): the plan names it, and the package's commands carry it, so the baseline and every variant
evaluate with the same procedure on that card.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tunepilot.sizing.fit import MIN_HEADROOM

EVALUATION = "evaluation"


def eval_peak(dry: Any) -> int:
    """The evaluation phase's tensor peak in a dry run (0 when it has none)."""
    return max((int(p.peak) for p in dry.phases if p.phase.startswith(EVALUATION)), default=0)


@dataclass(frozen=True)
class EvalLine:
    """Evaluation's peak as `at_one + (batch - 1) x slope`, at the configured length."""

    at_one: int
    slope: float
    configured: int  # the campaign's training.eval_batch_size

    @classmethod
    def from_runs(cls, at_one: Any, configured: Any, batch: int) -> EvalLine:
        one, mine = eval_peak(at_one), eval_peak(configured)
        return cls(one, max(0.0, (mine - one) / (batch - 1)) if batch > 1 else 0.0, batch)

    def peak(self, batch: int) -> int:
        return int(self.at_one + (batch - 1) * self.slope)


def largest_eval_batch(card: Any, line: EvalLine, context: int) -> int:
    """THE largest eval batch (at most the configured one) whose evaluation fits `card` with
    the headroom kept free; 0 when one example does not fit."""
    budget = card.memory_bytes * (1 - MIN_HEADROOM) - context
    if line.at_one > budget:
        return 0
    if line.slope <= 0:
        return line.configured
    return max(1, min(line.configured, 1 + int((budget - line.at_one) // line.slope)))


def eval_line(runs: Any, inputs: Any) -> EvalLine:
    """The line from the sheet's dry runs at eval batch 1 and at the configured batch."""
    base = inputs.setting
    one = runs(replace(base, eval_batch=1)) if inputs.eval_batch > 1 else runs(base)
    return EvalLine.from_runs(one, runs(base), inputs.eval_batch)


def fitting_eval_batch(card: Any, runs: Any, inputs: Any, context: int) -> int | None:
    """The largest eval batch that fits `card` at the configured base (None at another base,
    where the sheet's line does not apply): what `card_setting` and the nearest change use."""
    if inputs.on(card).base_dtype != inputs.base_dtype:
        return None
    return largest_eval_batch(card, eval_line(runs, inputs), context)


def card_setting(card: Any, runs: Any, inputs: Any, setting: Any) -> tuple[Any, Any, int]:
    """(setting, its dry run, eval batch) of `card`'s row: with `training.eval_batch_size`
    unset and the configured batch too large for the card, the largest that fits."""
    dry = runs(setting)
    if inputs.eval_batch_set:
        return setting, dry, inputs.eval_batch  # the user's batch, judged as it is
    chosen = fitting_eval_batch(card, runs, inputs, int(dry.cuda_context_bytes))
    if chosen is not None and 1 <= chosen < inputs.eval_batch:
        setting = replace(setting, eval_batch=chosen)
        return setting, runs(setting), chosen
    return setting, dry, inputs.eval_batch
