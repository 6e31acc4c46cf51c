"""Labels that contradict themselves (D2, D6): one text with two labels, one class with two
spellings.

An exact duplicate with the *same* label only weighs double; one with *another* label is a
contradiction: in training the model is taught both answers, and across splits the evaluation
scores a correct answer as wrong. The `drop_exact_duplicates` rule keeps the first copy of a
text, so without a record the contradiction would vanish with the copy it dropped: the rule
keeps it on record (`RuleCount.conflicts`) and the check below reports both.

Two spellings of one class (`Refund` and `refund`, `card_arrival` and `card-arrival`) are two
classes to the model, each with half the examples; the check names both spellings.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from tunepilot.campaign import CLASSIFICATION_TASKS
from tunepilot.data.audit.labels import FAIL, PASS, SHOWN, WARN, _order
from tunepilot.data.clean import answer_of
from tunepilot.data.prepared import RuleCount
from tunepilot.tasks.example import Splits
from tunepilot.verdict import Finding

_NOT_WORD = re.compile(r"[\W_]+")


@dataclass(frozen=True)
class Member:
    """One row of a conflicting group: where it sits and what it is labelled."""

    split: str  # "train", "validation", "test", or "dropped" (by drop_exact_duplicates)
    id: str
    source: str
    answer: str

    def shown(self) -> str:
        return f"{self.answer!r} at {self.source} ({self.split})"


def conflicting_groups(groups: list[list[Member]]) -> list[list[Member]]:
    """The groups of identical inputs whose members carry more than one label or answer."""
    return [g for g in groups if len({m.answer for m in g}) > 1]


def dropped_conflicts(cleaning: list[RuleCount], is_generic: Any = None
                      ) -> tuple[list[list[Member]], list[list[Member]]]:  # fmt: skip
    """The contradictions drop_exact_duplicates removed from the data, as (kept, dropped)
    pairs: (those of a real text, those of a generic short turn)."""
    texts, formulas = [], []
    for count in cleaning:
        for c in count.conflicts:
            pair = [Member("kept", c["kept"], c.get("kept_source", c["kept"]),
                           str(c["kept_answer"])),
                    Member("dropped", c["dropped"], c["source"], str(c["dropped_answer"]))]
            generic = is_generic is not None and is_generic(c.get("text", ""))
            (formulas if generic else texts).append(pair)
    return texts, formulas


def check_conflicting_answers(
    splits: Splits,
    groups: list[Any],
    cleaning: list[RuleCount],
    task: str,
    is_generic: Any = None,
) -> Finding:
    """D2/D6: the same input after normalisation with different labels (answers), inside a
    split, across splits, or hidden by drop_exact_duplicates. FAIL for classification when
    an evaluation split holds one (a correct answer is scored wrong), a WARN when only
    training does or deduplication removed it (label noise, the first copy's label kept),
    and for generation tasks (a context the model is not given can explain it). A generic
    short turn said in many groups ("thanks, that solved it!", `data.generic`) carries its
    group's label, not a label of its words: counted apart, a WARN."""
    by_id = {ex.id: (s, ex) for s in _order(splits) for ex in splits[s]}
    texts, formulas = [], []
    for g in groups:
        rows = [(by_id[i][0], by_id[i][1]) for ids in g.members.values() for i in ids]
        members = [Member(s, ex.id, ex.source, a) for s, ex in rows
                   if (a := answer_of(ex)) is not None]  # fmt: skip
        (formulas if is_generic is not None and is_generic(g.text) else texts).append(members)
    dropped, dropped_formulas = dropped_conflicts(cleaning, is_generic)
    generic = conflicting_groups(formulas) + dropped_formulas
    return conflict_finding(conflicting_groups(texts), dropped, task, "text", generic)


def conflict_finding(
    found: list[list[Member]], dropped: list[list[Member]], task: str, what: str,
    generic: list[list[Member]] | None = None,
) -> Finding:  # fmt: skip
    """One Finding for contradicting groups (`what`: "text" or "picture"), shared by the text
    and image audits; `generic` are those of generic short turns, reported apart."""
    check = "conflicting labels"
    noun = "labels" if task in CLASSIFICATION_TASKS else "answers"
    formulas = _generic_part(generic or [], noun)
    if not found and not dropped:
        if generic:
            return Finding(check, WARN, formulas[2:], "D2, D6",
                           examples=[m.id for g in generic[:2] for m in _two(g)],
                           details={"generic": len(generic)})  # fmt: skip
        sentence = f"no {what} carries two different {noun} after normalisation"
        return Finding(check, PASS, sentence, "D2, D6")
    across = sum(1 for g in found if len({m.split for m in g}) > 1)
    scored = [g for g in found if any(m.split not in ("train", "kept", "dropped") for m in g)]
    parts = []
    if found:
        shown = "; ".join(" vs ".join(m.shown() for m in _two(g)) for g in found[:3])
        parts.append(f"{len(found)} {what}(s) carry different {noun} ({across} across splits, "
                     f"{len(found) - across} inside one split; e.g. {shown})")  # fmt: skip
    if dropped:
        kept, gone = dropped[0]
        parts.append(
            f"{len(dropped)} {'more ' if found else ''}{what}(s) with different {noun} were "
            "hidden by data.cleaning's drop_exact_duplicates, which kept the first copy's "
            f"{noun[:-1]} and dropped the other (e.g. kept {kept.answer!r} at {kept.source}, "
            f"dropped {gone.answer!r} at {gone.source})"
        )
    harm = ("the evaluation scores a correct answer as wrong" if scored else
            "training is taught both" if found else
            f"training keeps whichever {noun[:-1]} came first")  # fmt: skip
    sentence = (
        f"{'; '.join(parts)}: {harm}; correct the {noun} of those rows, or give the input "
        "that tells them apart (data.fields.context)" + formulas
    )
    # FAIL where an evaluation split holds the contradiction (a correct answer scored wrong);
    # inside training, or removed by deduplication, the labels are noise: a WARN
    verdict = FAIL if scored and task in CLASSIFICATION_TASKS else WARN
    details = {
        "groups": len(found),
        "across_splits": across,
        "hidden_by_dedup": len(dropped),
        "generic": len(generic or []),
        "examples": [[m.__dict__ for m in g[:6]] for g in (found + dropped)[:50]],
    }
    ids = [m.id for g in (found + dropped)[:3] for m in _two(g)][:SHOWN]
    return Finding(check, verdict, sentence, "D2, D6", examples=ids, details=details)


def _generic_part(generic: list[list[Member]], noun: str) -> str:
    if not generic:
        return ""
    shown = "; ".join(" vs ".join(m.shown() for m in _two(g)) for g in generic[:2])
    return (f"; {len(generic)} generic short turn(s) said in many groups carry different "
            f"{noun} (e.g. {shown}): the {noun[:-1]} comes from the conversation, not the "
            "words; read them, and drop such formulas or give them their own class")


def _two(group: list[Member]) -> list[Member]:
    """The first member and the first one labelled differently."""
    first = group[0]
    other = next(m for m in group if m.answer != first.answer)
    return [first, other]


def spelling_key(label: str) -> str:
    """A label without case, whitespace, punctuation or underscores: `Card-Arrival ` and
    `card_arrival` share one key."""
    return _NOT_WORD.sub("", label.casefold())


def check_label_spellings(splits: Splits, declared: list[str] | None = None) -> Finding:
    """D6: two labels that differ only by case, whitespace or punctuation are two classes to
    the model; FAIL naming every spelling with its count and a row that uses it."""
    check = "label spellings"
    counts: Counter[str] = Counter()
    where: dict[str, str] = {}
    for split in _order(splits):
        for ex in splits[split]:
            if ex.label is not None:
                counts[ex.label] += 1
                where.setdefault(ex.label, ex.source)
    for name in declared or []:
        counts.setdefault(name, 0)
        where.setdefault(name, "data.labels")
    spellings: dict[str, list[str]] = defaultdict(list)
    for name in counts:
        spellings[spelling_key(name)].append(name)
    twice = [sorted(names, key=lambda n: -counts[n]) for names in spellings.values()
             if len(names) > 1]  # fmt: skip
    if not twice:
        sentence = (f"{len(counts)} class names, no two of which differ only by case, "
                    "whitespace or punctuation")  # fmt: skip
        return Finding(check, PASS, sentence, "D6")
    shown = "; ".join(
        " and ".join(f"`{n}` ({counts[n]} rows, e.g. {where[n]})" for n in names)
        for names in twice[:3]
    )
    sentence = (
        f"{len(twice)} class(es) exist under more than one spelling: {shown}; the model treats "
        "each spelling as its own class, with part of the examples each: write one spelling "
        "in the files (and in data.labels)"
    )
    details = {"spellings": [{n: counts[n] for n in names} for names in twice[:50]]}
    return Finding(check, FAIL, sentence, "D6", examples=[n for g in twice[:2] for n in g],
                   details=details)  # fmt: skip
