"""Gate 9, the tiny-subset overfit (D7): a handful of examples learned at a raised lr.

PASS needs finite values, a falling loss and their labels or answers recovered. A check of the
mechanics, never of generalisation: if it fails, a long rental will not fix it.
"""

from __future__ import annotations

import math
from typing import Any

from tunepilot.pilot.phases import Outcome, PilotState
from tunepilot.pilot.update import make_optimizer, train_update
from tunepilot.verdict import Verdict

OVERFIT_EXAMPLES = 8
OVERFIT_MAX_UPDATES = 100
OVERFIT_LR_FACTOR = 10.0
OVERFIT_LOSS_FACTOR = 4.0
OVERFIT_TOKEN_SHARE = 0.9
"""D7 sizes, stated in the row: 8 examples, at most 100 updates (stopping once both goals are
met) at 10x the campaign's lr; PASS when every loss is finite, the loss falls at least 4x and
every label (classification) or 90% of the answer tokens, teacher-forced, are recovered."""


def _subset(state: PilotState) -> list[Any]:
    """The shortest training examples, one class after another for classification: the
    mechanics do not need long inputs, and short ones keep the gate cheap."""
    data = sorted(state.encoded.train, key=lambda e: (len(e.input_ids), e.example_id))
    if state.kind != "classification":
        return data[:OVERFIT_EXAMPLES]
    by_class: dict[int, list[Any]] = {}
    for e in data:
        by_class.setdefault(e.labels[0], []).append(e)
    queues = [by_class[k] for k in sorted(by_class)]
    picked: list[Any] = []
    while len(picked) < min(OVERFIT_EXAMPLES, len(data)):
        for q in queues:
            if q and len(picked) < OVERFIT_EXAMPLES:
                picked.append(q.pop(0))
    return picked


def _recovered(state: PilotState, update: list[list[Any]]) -> tuple[int, int]:
    """(recovered, total): labels by argmax, or answer tokens by teacher-forced argmax."""
    import torch

    from tunepilot.tasks.base import IGNORE_INDEX
    from tunepilot.train.batching import collate

    hit = total = 0
    state.model.eval()
    try:
        with torch.no_grad():
            for mb in update:
                cpu = collate(mb, state.kind, state.pad_id, state.packing)
                b = {k: v.to(state.device) for k, v in cpu.items()}
                logits = state.model(**{k: v for k, v in b.items() if k != "labels"}).logits
                if state.kind == "classification":
                    hit += int((logits.argmax(-1) == b["labels"]).sum())
                    total += len(mb)
                else:
                    pred, gold = logits[:, :-1].argmax(-1), b["labels"][:, 1:]
                    mask = gold != IGNORE_INDEX
                    hit += int(((pred == gold) & mask).sum())
                    total += int(mask.sum())
    finally:
        state.model.train()
    return hit, total


def overfit_gate(state: PilotState) -> Outcome:
    """Gate 9 (D7): a handful of examples learned to check the mechanics. The trainable
    weights are restored afterwards, so later gates see the model as the steps left it."""
    import torch

    t = state.training
    subset = _subset(state)
    # Microbatches never hold more tokens than the configured one at the longest length, which
    # the first step proved: the subset's short examples usually fit in one.
    proven = t.microbatch * max(1, *(len(e.input_ids) for e in state.encoded.train))
    mb = max(1, min(len(subset), proven // max(1, *(len(e.input_ids) for e in subset))))
    update = [subset[i : i + mb] for i in range(0, len(subset), mb)]
    lr = t.lr * OVERFIT_LR_FACTOR
    params = [p for p in state.model.parameters() if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    optimizer = make_optimizer(state.model, t, lr)
    losses: list[float] = []
    hit, total = 0, 0
    unit = "labels" if state.kind == "classification" else "answer tokens"
    where = (
        f"the {len(subset)} shortest training examples, lr {lr:.3g} "
        f"({OVERFIT_LR_FACTOR:.0f}x the campaign's)"
    )
    try:
        for n in range(1, OVERFIT_MAX_UPDATES + 1):
            loss, norm = train_update(state, update, optimizer, lr)
            losses.append(loss)
            if not (math.isfinite(loss) and math.isfinite(norm)):
                return Outcome(Verdict.FAIL, f"{where}: update {n} gave loss {loss} (gradient norm "
                               f"{norm}); lower training.lr (tried {lr:.3g} here, the campaign "
                               f"uses {t.lr:.3g}) and check the data; a long rental will not fix "
                               "it (D7)", {"losses": losses}, dict(state.shape))  # fmt: skip
            fell = loss <= losses[0] / OVERFIT_LOSS_FACTOR
            if fell and (n % 5 == 0 or n == OVERFIT_MAX_UPDATES):
                hit, total = _recovered(state, update)
                if hit >= _needed(state, total):
                    break
        if not hit:
            hit, total = _recovered(state, update)
    finally:
        with torch.no_grad():
            for p, old in zip(params, saved, strict=True):
                p.copy_(old)
                p.grad = None
    factor = losses[0] / losses[-1] if losses[-1] > 0 else math.inf
    details = {"losses": losses, "recovered": hit, "total": total, "lr": lr, "updates": len(losses),
               "example_ids": [e.example_id for e in subset]}  # fmt: skip
    seen = (f"{where}, {len(losses)} updates: loss {losses[0]:.3f} -> {losses[-1]:.3g} "
            f"(fell {factor:.1f}x, goal >= {OVERFIT_LOSS_FACTOR:.0f}x), {hit}/{total} {unit} "
            "recovered")  # fmt: skip
    note = "a check of the mechanics, not a claim about generalisation (D7)"
    recovered = hit >= _needed(state, total)
    if factor >= OVERFIT_LOSS_FACTOR and recovered:
        return Outcome(Verdict.PASS, f"{seen}; {note}", details, dict(state.shape))
    if recovered and factor > 1:  # it learns them, but cannot make the output confident
        return Outcome(Verdict.WARN, f"{seen}: recovered, yet the loss barely falls: the trained "
                       "part ranks the answers but cannot sharpen the output (is the output layer "
                       f"frozen? see model.lora.modules_to_save); {note}", details,
                       dict(state.shape))  # fmt: skip
    return Outcome(Verdict.FAIL, f"{seen}: the model cannot learn even these; check the labels, "
                   "the loss mask, and that the trained parameters reach the output and are "
                   "enough (LoRA rank, target modules): a long rental will not fix it; "
                   f"{note}", details, dict(state.shape))  # fmt: skip


def _needed(state: PilotState, total: int) -> int:
    if state.kind == "classification":
        return total
    return int(total * OVERFIT_TOKEN_SHARE + 0.999999)
