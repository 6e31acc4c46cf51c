"""Audit checks for conversations: one unit for duplicates (D2, D8), one stop token (D5).

The ordinary duplicate checks key a conversation on the whole of it, answers included (see
`clean.duplicate_key`). This one keys it on its user and system turns only: an evaluation
conversation whose questions all appear, in order, in a training conversation measures whether
the model remembers that training answer, even when the answers were worded differently.
"""

from __future__ import annotations

from typing import Any

from tunepilot.data.audit_labels import FAIL, PASS, SHOWN, WARN, _later, _noun, _nouns, _order
from tunepilot.data.normalize import normalize_text
from tunepilot.tasks.base import IGNORE_INDEX
from tunepilot.tasks.example import Splits
from tunepilot.verdict import Finding


def check_same_user_turns(splits: Splits) -> Finding:
    """D2/D8: evaluation conversations asking exactly what a training conversation asked."""
    check = "same user turns across splits"
    first_of: dict[str, str] = {}
    for split in _order(splits):
        for ex in splits[split]:
            first_of.setdefault(normalize_text(ex.text), ex.id)
    earlier_ids = {s: {ex.id for s2 in e for ex in splits[s2]} for s, e in _later(splits)}
    repeated: dict[str, list[tuple[str, str]]] = {}
    for split in earlier_ids:
        for ex in splits[split]:
            first = first_of[normalize_text(ex.text)]
            if first in earlier_ids[split]:
                repeated.setdefault(split, []).append((ex.id, first))
    if not repeated:
        sentence = (
            "no evaluation conversation repeats the user turns of an earlier split's "
            "conversation after normalisation"
        )
        return Finding(check, PASS, sentence, "D2, D8")
    earlier_of = dict(_later(splits))
    parts = [
        f"{len(p)} {_noun(s)} conversations ask what a {_nouns(earlier_of[s])} conversation asked"
        for s, p in repeated.items()
    ]
    pairs = [p for ps in repeated.values() for p in ps]
    shown = ", ".join(f"{a} = {b}" for a, b in pairs[:3])
    sentence = (
        f"{' and '.join(parts)}, turn for turn (e.g. {shown}); the score would measure a "
        "remembered answer: remove them or split by conversation (data.fields.group)"
    )
    details = {"counts": {s: len(p) for s, p in repeated.items()}, "pairs": pairs[:50]}
    return Finding(check, FAIL, sentence, "D2, D8", examples=[a for a, _ in pairs[:SHOWN]],
                   details=details)  # fmt: skip


def check_turn_end(splits: Splits, encoder: Any) -> Finding:
    """D5: evaluation generates until the tokenizer's EOS. A chat template that closes
    assistant turns with another token (a base model's `<|endoftext|>` against the template's
    `<|im_end|>`) trains the model to stop where evaluation never looks: every answer then runs
    to max_new_tokens and scores as wrong."""
    check = "assistant turns end with EOS"
    tokenizer = encoder.tokenizer
    eos = tokenizer.eos_token_id
    first = next((ex for s in _order(splits) for ex in splits[s]), None)
    if first is None:
        return Finding(check, WARN, "no conversation to check: cannot validate", "D5")
    enc = encoder.encode(first)
    trained = [t for t in enc.labels if t != IGNORE_INDEX]
    if eos in trained:
        sentence = (f"the trained tokens of {first.id} include EOS {tokenizer.eos_token!r}: "
                    "generation at evaluation stops where training taught it to")  # fmt: skip
        return Finding(check, PASS, sentence, "D5")
    last = tokenizer.decode(trained[-1:], skip_special_tokens=False) if trained else "nothing"
    sentence = (
        f"the assistant turns of {first.id} are trained to end with {last!r}, not with the "
        f"tokenizer's EOS {tokenizer.eos_token!r}, and evaluation stops only at EOS: answers "
        "would run to training.max_new_tokens; set the tokenizer's eos_token to the template's "
        "end-of-turn token, or use a template that closes turns with eos_token"
    )
    return Finding(check, WARN, sentence, "D5", examples=[first.id])
