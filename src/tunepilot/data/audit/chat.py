"""Audit checks for conversations: one unit for duplicates (D2, D8), one stop token (D5).

The ordinary duplicate checks key a conversation on the whole of it, answers included (see
`clean.duplicate_key`). These key it on its user and system turns only (an evaluation
conversation asking what a training one asked measures a remembered answer, however the
answers were worded), and on its opening exchange (rows cut from one conversation).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tunepilot.data.audit.labels import FAIL, PASS, SHOWN, WARN, _later, _noun, _nouns, _order
from tunepilot.data.normalize import normalize_text
from tunepilot.errors import InputError
from tunepilot.tasks.base import IGNORE_INDEX
from tunepilot.tasks.example import Example, Splits
from tunepilot.verdict import Finding


def _repeats(splits: Splits, key: Callable[[Example], str]) -> dict[str, list[tuple[str, str]]]:
    """{evaluation split: [(its id, the earlier split's id with the same key)]}."""
    first_of: dict[str, str] = {}
    for split in _order(splits):
        for ex in splits[split]:
            first_of.setdefault(key(ex), ex.id)
    earlier_ids = {s: {ex.id for s2 in e for ex in splits[s2]} for s, e in _later(splits)}
    repeated: dict[str, list[tuple[str, str]]] = {}
    for split, before in earlier_ids.items():
        for ex in splits[split]:
            first = first_of[key(ex)]
            if first in before:
                repeated.setdefault(split, []).append((ex.id, first))
    return repeated


def _user_turns(ex: Example) -> str:
    return normalize_text(ex.text)


def _opening(ex: Example) -> str:
    """The turns up to the first answer, normalised: what rows cut from one conversation
    (one row per turn, a common way to expand multi-turn data) all share."""
    turns = ex.messages or []
    end = next((i for i, t in enumerate(turns) if t["role"] == "assistant"), len(turns))
    return json.dumps([[t["role"], normalize_text(t["content"])] for t in turns[: end + 1]])


def _sentence(splits: Splits, repeated: dict[str, list[tuple[str, str]]], verb: str) -> str:
    earlier_of = dict(_later(splits))
    parts = [f"{len(p)} {_noun(s)} conversations {verb} a {_nouns(earlier_of[s])} conversation"
             for s, p in repeated.items()]  # fmt: skip
    pairs = [p for ps in repeated.values() for p in ps]
    shown = ", ".join(f"{a} ~ {b}" for a, b in pairs[:3])
    return f"{' and '.join(parts)} (e.g. {shown})"


def _repeat_check(
    check: str,
    verdict: str,
    req: str,
    splits: Splits,
    repeated: dict[str, list[tuple[str, str]]],
    *,
    clean: str,
    verb: str,
    advice: str,
) -> Finding:
    """PASS saying `clean`, or `verdict` counting the repeated conversations per split with the
    first pairs, then `advice`."""
    if not repeated:
        return Finding(check, PASS, clean, req)
    pairs = [p for ps in repeated.values() for p in ps]
    details = {"counts": {s: len(p) for s, p in repeated.items()}, "pairs": pairs[:50]}
    return Finding(check, verdict, _sentence(splits, repeated, verb) + advice, req,
                   examples=[a for a, _ in pairs[:SHOWN]], details=details)  # fmt: skip


def check_same_user_turns(splits: Splits) -> Finding:
    """D2/D8: evaluation conversations asking exactly what a training conversation asked."""
    return _repeat_check(
        "same user turns across splits", FAIL, "D2, D8", splits, _repeats(splits, _user_turns),
        clean="no evaluation conversation repeats the user turns of an earlier split's "
        "conversation after normalisation",
        verb="ask, turn for turn, what was asked in",
        advice="; the score would measure a remembered answer: remove them or split by "
        "conversation (data.fields.group)",
    )


def check_shared_openings(splits: Splits) -> Finding:
    """D8: rows of one conversation on both sides of a split. Without a declared conversation
    id, the sign is an evaluation row opening with the same exchange (first user turn and
    first answer) as a training row that asks something else later. A WARN, not a FAIL: two
    conversations can open the same way ("hi" / "Hello, how can I help?")."""
    asked = {a for ps in _repeats(splits, _user_turns).values() for a, _ in ps}
    repeated = {
        s: kept
        for s, ps in _repeats(splits, _opening).items()
        if (kept := [p for p in ps if p[0] not in asked])
    }
    return _repeat_check(
        "conversations cut into rows", WARN, "D8", splits, repeated,
        clean="no evaluation conversation opens with an earlier split's opening exchange",
        verb="open with the same exchange as",
        advice=": rows cut from one conversation would leak its later turns; give each row its "
        "conversation id in data.fields.group and use split.policy: group",
    )


def check_turn_end(splits: Splits, encoder: Any) -> Finding:
    """D5: evaluation generates until the tokenizer's EOS. A chat template that closes
    assistant turns with another token (a base model's `<|endoftext|>` against the template's
    `<|im_end|>`) trains the model to stop where evaluation never looks: every answer then runs
    to max_new_tokens and scores as wrong."""
    check = "assistant turns end with EOS"
    tokenizer = encoder.tokenizer
    eos = tokenizer.eos_token_id
    first, enc = None, None
    for ex in (ex for s in _order(splits) for ex in splits[s]):
        try:  # a row the template refuses is the length check's FAIL, named there
            first, enc = ex, encoder.encode(ex)
            break
        except InputError:
            continue
    if first is None or enc is None:
        return Finding(check, WARN, "no conversation encodes: cannot validate", "D5")
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
