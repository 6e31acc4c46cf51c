"""Declared cleaning rules, applied in the campaign's order and counted (D1).

Why counted: a rule that silently drops 400 rows changes the experiment as much as a new data
file. Each rule returns a `RuleCount` (changed / dropped, a few example ids) that the audit
shows, and the rules are part of the data version. Rules touch the input text and string
context values, never labels or targets: those are the answer, not the input.

A conversation's rules touch its system and user turns (`max_chars` limits each turn), and its
input text is rebuilt from them; assistant turns are the answer and stay as written.

`drop_exact_duplicates` keeps the first occurrence of `normalize_text(text)` + context, so run
it on the whole file set in order train, validation, test before splitting: the training copy
wins and an evaluation split never holds a copy of a training example. A dropped copy whose
label (or answer) differs from the kept one is a contradiction in the data, not a duplicate:
it is recorded in the rule's `conflicts`, and the audit FAILs naming both rows (D2, D6).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from tunepilot.data.chat_rows import INPUT_ROLES, input_text
from tunepilot.data.normalize import normalize_text
from tunepilot.data.prepared import RuleCount
from tunepilot.tasks.example import Example

EXAMPLE_IDS = 5
MAX_CONFLICTS = 1000  # dropped copies with another answer kept on record (the audit counts them)
_WHITESPACE = re.compile(r"\s+")

_TEXT_RULES: dict[str, Callable[[str], str]] = {
    "nfc": lambda s: unicodedata.normalize("NFC", s),
    "strip": str.strip,
    "collapse_whitespace": lambda s: _WHITESPACE.sub(" ", s),
    "lowercase": str.lower,
}


def rule_name(rule: str | dict[str, Any]) -> str:
    """`{max_chars: 512}` -> "max_chars=512"; names are what the audit shows."""
    if isinstance(rule, dict):
        return ",".join(f"{k}={v}" for k, v in rule.items())
    return rule


def clean(
    examples: Sequence[Example], rules: Sequence[str | dict[str, Any]]
) -> tuple[list[Example], list[RuleCount]]:
    """Apply `rules` in order: the kept examples (order preserved) and one count per rule."""
    current = list(examples)
    counts: list[RuleCount] = []
    for rule in rules:
        count = RuleCount(rule=rule_name(rule))
        if isinstance(rule, dict):
            limit = int(rule["max_chars"])
            current = _map_text(current, lambda s, n=limit: s[:n], count, context_too=False)
        elif rule in _TEXT_RULES:
            current = _map_text(current, _TEXT_RULES[rule], count)
        elif rule == "drop_empty":
            current = _drop(current, lambda ex, _seen: not ex.text.strip(), count)
        elif rule == "drop_exact_duplicates":
            current = _drop_repeats(current, count)
        else:  # the campaign schema rejects unknown rules; this guards direct callers
            raise ValueError(f"unknown cleaning rule {rule!r}")
        counts.append(count)
    return current, counts


def duplicate_key(example: Example) -> str:
    """What "the same example" means for drop_exact_duplicates: normalised text + context; for
    a conversation, the whole conversation (its answers too, turn by turn)."""
    context = {
        k: normalize_text(v) if isinstance(v, str) else v
        for k, v in sorted(example.context.items())
    }
    key = normalize_text(example.text) + "\x00" + json.dumps(context, sort_keys=True, default=str)
    if example.messages is not None:
        turns = [[t["role"], normalize_text(t["content"])] for t in example.messages]
        key += "\x00" + json.dumps(turns, ensure_ascii=False)
    return key


def _map_text(
    examples: list[Example],
    fn: Callable[[str], str],
    count: RuleCount,
    context_too: bool = True,
) -> list[Example]:
    """Text rules also normalise string context values (they are model input too);
    `max_chars` limits the text only."""
    out = []
    for ex in examples:
        messages = ex.messages
        if messages is not None:
            messages = [
                t if t["role"] not in INPUT_ROLES else {**t, "content": fn(t["content"])}
                for t in messages
            ]
            text = input_text(messages)
        else:
            text = fn(ex.text)
        context = ex.context
        if context_too:
            context = {k: fn(v) if isinstance(v, str) else v for k, v in ex.context.items()}
        if text != ex.text or context != ex.context or messages != ex.messages:
            ex = replace(ex, text=text, context=context, messages=messages)
            count.changed += 1
            if len(count.example_ids) < EXAMPLE_IDS:
                count.example_ids.append(ex.id)
        out.append(ex)
    return out


def answer_of(example: Example) -> str | None:
    """What an example must be answered with, as one comparable string: its label, else its
    target as canonical JSON (None when it has neither)."""
    if example.label is not None:
        return example.label
    if example.target is None:
        return None
    return json.dumps(example.target, sort_keys=True, ensure_ascii=False, default=str)


def _drop_repeats(examples: list[Example], count: RuleCount) -> list[Example]:
    """drop_exact_duplicates: the first copy of each key stays; a dropped copy that carries
    another label or answer is kept on record in `count.conflicts` (never silently gone)."""
    kept: dict[str, Example] = {}

    def repeat(ex: Example, _seen: set[str] | None) -> bool:
        first = kept.setdefault(duplicate_key(ex), ex)
        if first is ex:
            return False
        if answer_of(first) != answer_of(ex) and len(count.conflicts) < MAX_CONFLICTS:
            count.conflicts.append({"kept": first.id, "kept_answer": answer_of(first),
                                    "kept_source": first.source, "dropped": ex.id,
                                    "dropped_answer": answer_of(ex), "source": ex.source,
                                    "text": ex.text[:500]})
        return True

    return _drop(examples, repeat, count)


def _drop(
    examples: list[Example],
    should_drop: Callable[[Example, set[str] | None], bool],
    count: RuleCount,
    seen: set[str] | None = None,
) -> list[Example]:
    out = []
    for ex in examples:
        if should_drop(ex, seen):
            count.dropped += 1
            if len(count.example_ids) < EXAMPLE_IDS:
                count.example_ids.append(ex.id)
        else:
            out.append(ex)
    return out
