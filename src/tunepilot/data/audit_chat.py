"""Audit checks that treat a conversation as one unit (D2, D8).

The ordinary duplicate checks key a conversation on the whole of it, answers included (see
`clean.duplicate_key`). This one keys it on its user and system turns only: an evaluation
conversation whose questions all appear, in order, in a training conversation measures whether
the model remembers that training answer, even when the answers were worded differently.
"""

from __future__ import annotations

from tunepilot.data.audit_labels import FAIL, PASS, SHOWN, _later, _noun, _nouns, _order
from tunepilot.data.normalize import normalize_text
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
