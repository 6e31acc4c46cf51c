"""Audit of the gold answers of an extraction campaign against the answer's own contract (H2).

Why: the schema-validity and required-field guards judge the model's outputs against
`hypothesis.target_schema` and `required_fields`. A gold answer that breaks them is trained on
(the model learns the broken shape) and scored against (a perfect copy of it fails the guard),
so every such answer is counted per split and named by file:line before compute is spent.
"""

from __future__ import annotations

from typing import Any

from tunepilot.campaign.answer_schema import schema_errors
from tunepilot.data.audit.labels import FAIL, PASS, WARN, _noun, _order
from tunepilot.tasks.example import Splits
from tunepilot.verdict import Finding

SHOWN_PROBLEMS = 5  # file:line problems named in the sentence; 50 kept in details


def answer_problems(
    target: Any, required_fields: list[str], schema: dict[str, Any] | None
) -> list[str]:
    """Why one gold answer breaks the contract: missing required keys, then schema errors."""
    problems = []
    if required_fields:
        if not isinstance(target, dict):
            return [f"$: a JSON {type(target).__name__}, not an object with the required fields"]
        problems += [f"$: required field {name!r} is missing"
                     for name in required_fields if name not in target]  # fmt: skip
    if schema is not None:
        problems += schema_errors(target, schema)
    return problems


def check_gold_answers(
    splits: Splits, required_fields: list[str], schema: dict[str, Any] | None
) -> Finding:
    """H2: gold answers that violate `target_schema` or lack a required field, per split."""
    check = "gold answers vs the answer schema"
    if not required_fields and schema is None:
        sentence = (
            "cannot validate the gold answers: the campaign declares neither "
            "hypothesis.target_schema nor hypothesis.required_fields; declare them so answers "
            "(and the model's outputs) are checked"
        )
        return Finding(check, WARN, sentence, "H2")
    bad: dict[str, list[tuple[str, str, str]]] = {}  # split -> (id, source, first problem)
    checked = 0
    for split in _order(splits):
        for ex in splits[split]:
            if ex.target is None:
                continue
            checked += 1
            problems = answer_problems(ex.target, required_fields, schema)
            if problems:
                bad.setdefault(split, []).append((ex.id, ex.source, problems[0]))
    contract = " and ".join(
        part for part, on in (("hypothesis.target_schema", schema is not None),
                              ("hypothesis.required_fields", bool(required_fields))) if on
    )  # fmt: skip
    if not checked:
        sentence = "cannot validate the gold answers: no example has an answer to check"
        return Finding(check, WARN, sentence, "H2")
    if not bad:
        sentence = f"all {checked} gold answers match {contract}"
        return Finding(check, PASS, sentence, "H2", details={"checked": checked})
    counts = ", ".join(f"{len(rows)} {_noun(s)}" for s, rows in bad.items())
    flat = [row for rows in bad.values() for row in rows]
    shown = "; ".join(f"{source} {problem}" for _, source, problem in flat[:SHOWN_PROBLEMS])
    sentence = (
        f"gold answers that break {contract}: {counts} (e.g. {shown}); fix those rows or the "
        "schema: a model trained on them learns the broken shape, and a perfect copy of them "
        "fails the schema and required-field guards"
    )
    details = {
        "checked": checked,
        "per_split": {s: len(rows) for s, rows in bad.items()},
        "problems": [{"id": i, "source": src, "problem": p} for i, src, p in flat[:50]],
    }
    ids = [i for i, _, _ in flat[:SHOWN_PROBLEMS]]
    return Finding(check, FAIL, sentence, "H2", examples=ids, details=details)
