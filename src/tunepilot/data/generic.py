"""Generic short turns: texts that many independent units say word for word (D2, D8).

Why: in dialogue data, "thank you very much." or "yes, that is correct" is said in hundreds of
conversations. Under a clean group split such a text in training and in test is not a leak of
one conversation into another; it is a formula of the domain, and the model will meet it in
use too. Counting it as a leak would push a correct group split to FAIL and advise a split
that is already in place.

The rule, chosen to be checkable by hand: a text is generic when its words (lowercased `\\w+`
runs, so punctuation and case do not matter) number at most `GENERIC_MAX_WORDS` and the same
words occur in at least `GENERIC_MIN_GROUPS` distinct groups of the data as loaded (before
`drop_exact_duplicates` keeps one copy). A near pair is generic when both texts are that short
and one of them is generic. Without a declared group field nothing is generic: whether two
rows come from different units cannot be known.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tunepilot.tasks.example import Splits

GENERIC_MAX_WORDS = 8
GENERIC_MIN_GROUPS = 3
_WORD = re.compile(r"\w+")


def word_key(text: str) -> str:
    """The words of a text, lowercased, one space apart: what "word for word" compares."""
    return " ".join(_WORD.findall(text.lower()))


@dataclass
class GenericTexts:
    """Distinct groups per word key, over every split."""

    groups: dict[str, int]

    def is_generic(self, text: str) -> bool:
        key = word_key(text)
        n_words = len(key.split())
        return 0 < n_words <= GENERIC_MAX_WORDS and self.groups.get(key, 0) >= GENERIC_MIN_GROUPS

    def is_pair_generic(self, a: str, b: str) -> bool:
        """Two near copies are generic when both are short and one is a generic text: a
        formula with a filler word added ("great! thank you so much for your help.")."""
        short = all(0 < len(word_key(t).split()) <= GENERIC_MAX_WORDS for t in (a, b))
        return short and (self.is_generic(a) or self.is_generic(b))

    @property
    def rule(self) -> str:
        return (f"at most {GENERIC_MAX_WORDS} words, said word for word in at least "
                f"{GENERIC_MIN_GROUPS} groups")  # fmt: skip


def generic_texts(splits: Splits, group_field: str | None) -> GenericTexts | None:
    """The generic-text rule for these splits, or None without a group field."""
    if not group_field:
        return None
    seen: dict[str, set[str]] = {}
    for examples in splits.values():
        for ex in examples:
            if ex.group is None:
                continue
            key = word_key(ex.text)
            if len(key.split()) <= GENERIC_MAX_WORDS:
                seen.setdefault(key, set()).add(ex.group)
    return GenericTexts({key: len(groups) for key, groups in seen.items()})
