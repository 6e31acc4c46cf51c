"""The data version (D1): content hashes of everything that decides what the model sees.

A version has two parts: the example set (the examples, cleaned by the same rules, split the
same way) and its encoding (model, revision, max_length, template, loss mask, task, label
ids). Change any of those and the version changes; change nothing and it stays the same on any
machine, so a run records the version it saw. Keeping the parts apart is what lets a
max_length or template variant be compared with its control: same examples, another encoding
(S6). File paths and line numbers are not part of it: moving a file does not change the data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from tunepilot.campaign import stable_hash
from tunepilot.tasks.example import Example


def examples_hash(examples: Sequence[Example]) -> str:
    """16 hex chars over the examples' content, in order (order is what training iterates)."""
    return stable_hash([ex.content() for ex in examples])


ENCODING_CHARS = 8


def data_version(
    examples_by_split: Mapping[str, Sequence[Example]],
    cleaning_rules: Sequence[Any],
    split_policy: BaseModel | Mapping[str, Any],
    encoding: Mapping[str, Any],
) -> str:
    """`<examples>-<encoding>`: 16 hex chars for the example set, a dash, 8 for its encoding.

    Two parts because they answer two questions. The first says *which examples* (content per
    split, cleaning rules, split policy): two runs are comparable only if it is equal. The
    second says *how they were encoded* (model and tokenizer, max_length, template, loss
    mask, label ids): a max_length or template variant changes only it, and is compared with
    its control as long as its encoding did not cut the answers (S6).
    """
    return f"{examples_version(examples_by_split, cleaning_rules, split_policy)}-" + stable_hash(
        dict(encoding), length=ENCODING_CHARS
    )


def examples_version(
    examples_by_split: Mapping[str, Sequence[Example]],
    cleaning_rules: Sequence[Any],
    split_policy: BaseModel | Mapping[str, Any],
) -> str:
    """16 hex chars: sha256 of canonical JSON of examples per split, rules and policy."""
    policy = (
        split_policy.model_dump(mode="json")
        if isinstance(split_policy, BaseModel)
        else dict(split_policy)
    )
    return stable_hash(
        {
            "splits": {
                name: [ex.content() for ex in examples]
                for name, examples in sorted(examples_by_split.items())
            },
            "cleaning": list(cleaning_rules),
            "policy": policy,
        }
    )


def version_parts(version: str | None) -> tuple[str | None, str | None]:
    """(examples, encoding) of a data version; a version written before the split into two
    parts has no separate encoding: (the whole, None)."""
    if not version:
        return None, None
    examples, dash, encoding = version.partition("-")
    return (examples, encoding) if dash else (version, None)
