"""The data version (D1): one content hash for everything that decides what the model sees.

Why one hash over all of it: two runs are comparable only if they trained and evaluated on the
same examples, cleaned by the same rules, split the same way and encoded the same way (model,
revision, max_length, template, loss mask, task). Change any of those and the version changes;
change nothing and it stays the same on any machine, so a run records the version it saw.
File paths and line numbers are not part of it: moving a file does not change the data.
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


def data_version(
    examples_by_split: Mapping[str, Sequence[Example]],
    cleaning_rules: Sequence[Any],
    split_policy: BaseModel | Mapping[str, Any],
    encoding: Mapping[str, Any],
) -> str:
    """16 hex chars: sha256 of canonical JSON of examples per split, rules, policy, encoding."""
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
            "encoding": dict(encoding),
        }
    )
