"""The audit's unit checks (D8): whether one conversation, patient or document sits on both
sides of a split, and whether an evaluation split reaches back into an earlier period.

Their advice fits the split policy that produced the splits, because the fix differs: a
random split is told to split by group or time; a group or time split keeps its units whole
itself, so a leak under it can only come from an older sealed test; the user's own files
leak through what they share. A time split of whole groups (split.py) is judged by when each
group began: a group that ran on past a boundary is a WARN, never a leak.
"""

from __future__ import annotations

from typing import Any

from tunepilot.data.audit.labels import FAIL, PASS, SHOWN, WARN, _later, _noun, _nouns, _order
from tunepilot.data.split import group_starts, time_key
from tunepilot.tasks.example import Splits
from tunepilot.verdict import Finding


def check_group_leakage(splits: Splits, field: str | None, policy: str | None = None) -> Finding:
    """D8: examples of one conversation, patient or document on both sides of a split let the
    model recognise the unit instead of solving the task. The advice fits the policy: a group
    or time split keeps groups whole itself, so its leak can only come from the sealed test;
    the user's own files leak through what they share."""
    check = "group leakage"
    if not field:
        sentence = (
            "no leakage unit declared, so examples of one conversation, patient or document "
            "may sit in both training and evaluation unchecked; set data.fields.group "
            "(and split.policy: group) if your examples come in such units"
        )
        return Finding(check, WARN, sentence, "D8")
    groups_of = {s: {ex.group for ex in splits[s] if ex.group is not None} for s in _order(splits)}
    leaked: dict[str, list[str]] = {}
    parts: list[str] = []
    values: list[str] = []
    for split, earlier in _later(splits):
        before = set().union(*(groups_of[s] for s in earlier))
        ids = [ex.id for ex in splits[split] if ex.group in before]
        if ids:
            leaked[split] = ids
            parts.append(f"{len(ids)} {_noun(split)} examples share {field} with {_nouns(earlier)}")
            values += sorted(groups_of[split] & before)
    if not leaked:
        n = len(set().union(*groups_of.values()))
        sentence = f"each of {n} {field} values sits in one split only"
        return Finding(check, PASS, sentence, "D8", details={"groups": n})
    if policy in ("group", "time"):
        fix = (f"a `{policy}` split keeps {field} groups whole, so these come from the sealed "
               "test (data/test_seal.json, written under other split rules): delete it "
               "deliberately to seal a new test, or start a new campaign")  # fmt: skip
    elif policy == "files":
        fix = (f"move each shared {field} into one file, or leave the carved split's file out "
               "so tunepilot carves it by whole groups")  # fmt: skip
    else:
        fix = f"split by {field} (split.policy: group)"
    sentence = f"{' and '.join(parts)} (e.g. {', '.join(values[:3])}); {fix}"
    details = {
        "examples_per_split": {s: len(ids) for s, ids in leaked.items()},
        "groups": len(values),
        "group_values": values[:50],
    }
    ids = [i for ids in leaked.values() for i in ids][:SHOWN]
    return Finding(check, FAIL, sentence, "D8", examples=ids, details=details)


def check_time_overlap(splits: Splits, field: str, policy: str, group: str | None = None
                       ) -> Finding:  # fmt: skip
    """D8: an evaluation example dated before the end of an earlier split lets the model see
    the future of what it is scored on. FAIL, except under a group split: there the declared
    unit is the group and the overlap is a WARN to weigh against how the model will be used.
    With a `group` declared under any other policy, the split is judged by when each group
    began: groups kept whole that ran past the boundary are a WARN (carry-over, no leak)."""
    check = "time overlap"
    keyed = {s: [(time_key(ex.time), ex.id) for ex in splits[s]] for s in _order(splits)}
    bad = [i for rows in keyed.values() for k, i in rows if k is None]
    if bad:
        sentence = (
            f"{len(bad)} examples have no readable {field} (e.g. {', '.join(bad[:3])}); "
            "write ISO 8601 times to check periods"
        )
        return Finding(check, WARN, sentence, "D8", examples=bad[:SHOWN])
    if len({k[0] for rows in keyed.values() for k, _ in rows if k}) > 1:
        sentence = f"{field} mixes numbers, naive and aware times; write them one way to check"
        return Finding(check, WARN, sentence, "D8")
    time_of = {ex.id: ex.time for s in keyed for ex in splits[s]}
    span = {s: [time_of[min(rows)[1]], time_of[max(rows)[1]]] for s, rows in keyed.items()}  # type: ignore[type-var]
    periods = "; ".join(f"{s} {a} .. {b}" for s, (a, b) in span.items())
    overlaps: dict[str, list[str]] = {}
    for split, earlier in _later(splits):
        end = max(max(keyed[s])[0] for s in earlier)  # type: ignore[type-var]
        early = sorted(row for row in keyed[split] if row[0] <= end)  # type: ignore[operator]
        if early:
            overlaps[split] = [i for _, i in early]
    details: dict[str, Any] = {"periods": span}
    if not overlaps:
        sentence = f"each split's period starts after the previous one ends ({periods})"
        return Finding(check, PASS, sentence, "D8", details=details)
    verdict = WARN if policy == "group" else FAIL
    if verdict is WARN:
        fix = (
            "the split is by group; if the model will only meet later data, use split.policy: time"
        )
    elif group and _groups_begin_in_order(splits):
        verdict = WARN
        fix = (f"each split's {group} values all began after every earlier split's began: "
               f"whole {group} groups that ran on past the boundary, never the same one twice; "
               "weigh it if the model will only meet conversations that begin later")  # fmt: skip
    elif policy == "time":  # the split itself keeps periods apart: the seal is older
        fix = ("a `time` split keeps periods apart, so these come from the sealed test "
               "(data/test_seal.json, written under other split rules): delete it deliberately "
               "to seal a new test, or start a new campaign")  # fmt: skip
    elif policy == "files":
        fix = ("give files that follow each other in time, or leave the later split's file out "
               "so tunepilot carves the latest period")  # fmt: skip
    else:
        fix = "use split.policy: time"
    counts = " and ".join(f"{len(ids)} {_noun(s)} examples" for s, ids in overlaps.items())
    first = _order(splits)[0]
    ends = f"{_noun(first)} ends {span[first][1]}"
    sentence = f"{counts} are dated no later than the end of an earlier split ({ends}); {fix}"
    details["examples_per_split"] = {s: len(ids) for s, ids in overlaps.items()}
    ids = [i for ids in overlaps.values() for i in ids][:SHOWN]
    return Finding(check, verdict, sentence, "D8", examples=ids, details=details)


def _groups_begin_in_order(splits: Splits) -> bool:
    """Whether every group of each split began after every group of the earlier splits did
    (what a time split of whole groups guarantees), judged on readable times."""
    order = _order(splits)
    units = [{ex.group for ex in splits[s] if ex.group is not None} for s in order]
    if sum(map(len, units)) != len(set().union(*units)):
        return False  # a group in two splits: that is a leak, not a carry-over
    starts = {s: group_starts(splits[s], {ex.id: k for ex in splits[s]
                                          if (k := time_key(ex.time)) is not None})
              for s in order}  # fmt: skip
    for i, split in enumerate(order[1:], start=1):
        before = [v for s in order[:i] for v in starts[s].values()]
        if before and starts[split] and min(starts[split].values()) <= max(before):
            return False
    return True
