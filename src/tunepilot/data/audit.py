"""The data audit: what could make a campaign's numbers lie, found before compute is spent.

Each check is a small function returning one `Finding` (PASS / WARN / FAIL, one sentence that
says what was seen and what to do, a few example ids, the SPEC requirement ids):
cleaning counts (D1); exact duplicates within and across splits, near duplicates across
splits (D2); group leakage and overlapping periods (D8); evaluation labels absent from
training and class balance (D6, H2); the model head's label mapping (D6); token lengths and
truncation through the program's own encoder (D3, S6).

"Across splits" always means a later split repeating an earlier one, in the order train,
validation, test: an evaluation example equal to a training example is what inflates a score.
Pure Python + numpy: no torch here; the encoder, when given, brings its own tokenizer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any

from tunepilot.campaign import CLASSIFICATION_TASKS, DataSettings, Hypothesis
from tunepilot.data.audit_answers import check_gold_answers
from tunepilot.data.audit_chat import (
    check_same_user_turns,
    check_shared_openings,
    check_turn_end,
)
from tunepilot.data.audit_labels import (
    FAIL,
    PASS,
    SHOWN,
    WARN,
    _later,
    _noun,
    _nouns,
    _order,
    check_class_balance,
    check_label_mapping,
    check_lengths,
    check_position_limit,
    check_unseen_labels,
)
from tunepilot.data.dedup import DuplicateGroup, NearPair, build_index, exact_duplicates
from tunepilot.data.dedup import near_duplicates as find_near_duplicates
from tunepilot.data.generic import GenericTexts, generic_texts
from tunepilot.data.prepared import PreparedData, RuleCount
from tunepilot.data.split import time_key
from tunepilot.tasks.example import Splits
from tunepilot.verdict import Finding, Verdict, worst

NEAR_FAIL_SHARE = 0.05  # near copies in more than this share of an evaluation split: FAIL


def run_audit(
    prepared: PreparedData,
    data: DataSettings,
    task: str,
    encoder: Any = None,
    model_label_map: dict[int, str] | None = None,
    hypothesis: Hypothesis | None = None,
    model_config: dict[str, Any] | None = None,
) -> list[Finding]:
    """Every audit check over the prepared splits, in reading order.

    `hypothesis` brings the answer contract (extraction); `model_config` is the base model's
    config.json, for its position limit."""
    splits, audit = prepared.splits, data.audit
    index = build_index(splits)  # one normalisation pass shared by both duplicate searches
    groups = exact_duplicates(splits, index=index)
    threshold = audit.near_duplicate_threshold
    pairs = find_near_duplicates(splits, threshold, audit.shingle_size, index=index)
    leakage = check_group_leakage(splits, data.fields.group)
    generic = prepared.generic or generic_texts(splits, data.fields.group)
    apart = data.fields.group is not None and leakage.verdict is PASS
    findings = [
        check_cleaning(prepared.cleaning),
        check_exact_within(splits, groups),
        check_exact_across(splits, groups, generic, apart),
        check_near_duplicates(splits, pairs, threshold, generic, apart),
        leakage,
    ]
    if data.chat is not None:
        findings.append(check_same_user_turns(splits))
        if data.split.policy != "group":  # under a group split the group check covers it
            findings.append(check_shared_openings(splits))
        if encoder is not None:
            findings.append(check_turn_end(splits, encoder))
    if data.fields.time:
        findings.append(check_time_overlap(splits, data.fields.time, data.split.policy))
    if task in CLASSIFICATION_TASKS:
        findings.append(check_unseen_labels(splits))
        findings.append(check_class_balance(splits, prepared.label_names, audit))
        if model_label_map is not None:
            findings.append(check_label_mapping(model_label_map, prepared.label_names))
    if task == "extraction" and hypothesis is not None:
        findings.append(
            check_gold_answers(splits, hypothesis.required_fields, hypothesis.target_schema)
        )
    if model_config is not None:
        findings.append(check_position_limit(data.max_length, model_config))
    if encoder is not None:
        findings.append(check_lengths(splits, encoder, task, data.max_length, audit))
    return findings


def audit_to_json(findings: list[Finding]) -> dict[str, Any]:
    """The audit as audit.json holds it: overall verdict, counts per verdict, every finding."""
    counts = Counter(str(f.verdict) for f in findings)
    return {
        "verdict": str(worst(findings)),
        "counts": {v.value: counts.get(v.value, 0) for v in Verdict},
        "findings": [f.to_json() for f in findings],
    }


def check_cleaning(counts: list[RuleCount]) -> Finding:
    """D1: every declared rule with what it changed or dropped (informative, always PASS)."""
    if not counts:
        return Finding("cleaning", PASS, "no cleaning rules declared", "D1")
    parts = [
        f"{c.rule} changed {c.changed}" + (f", dropped {c.dropped}" if c.dropped else "")
        for c in counts
    ]
    ids = [i for c in counts for i in c.example_ids][:SHOWN]
    sentence = "cleaning applied in order: " + "; ".join(parts)
    details = {"rules": [asdict(c) for c in counts]}
    return Finding("cleaning", PASS, sentence, "D1", examples=ids, details=details)


def check_exact_within(splits: Splits, groups: list[DuplicateGroup]) -> Finding:
    """D2: a text repeated inside a split weighs more in training and counts twice in scores."""
    check = "exact duplicates within splits"
    extra = {s: sum(len(g.members[s]) - 1 for g in groups if g.within(s)) for s in _order(splits)}
    extra = {s: n for s, n in extra.items() if n}
    if not extra:
        return Finding(check, PASS, "no split repeats a text after normalisation", "D2")
    pairs = [g.members[s][:2] for s in extra for g in groups if g.within(s)][:3]
    counts = ", ".join(f"{s} {n}" for s, n in extra.items())
    shown = "; ".join(" = ".join(p) for p in pairs)
    sentence = (
        f"extra copies of a text inside a split after normalisation: {counts} (e.g. {shown}); "
        "add `drop_exact_duplicates` to data.cleaning"
    )
    ids = [i for p in pairs for i in p][:SHOWN]
    return Finding(check, WARN, sentence, "D2", examples=ids, details={"extra_rows": extra})


def _generic_note(n: int, generic: GenericTexts | None, sample: list[str]) -> str:
    if not n or generic is None:
        return ""
    return (f"; {n} more repeat generic short turns ({generic.rule}, e.g. "
            f"{', '.join(repr(t) for t in sample[:2])}), not counted as leaks")  # fmt: skip


def _generic_finding(check: str, n: int, generic: GenericTexts, sample: list[str],
                     details: dict[str, Any]) -> Finding:  # fmt: skip
    sentence = (
        f"{n} evaluation examples repeat only generic short turns across different groups "
        f"({generic.rule}; e.g. {', '.join(repr(t) for t in sample[:3])}): formulas the model "
        "will meet in use, not one unit leaking into another; read them, and add "
        "`drop_exact_duplicates` to data.cleaning if you want them out"
    )
    return Finding(check, WARN, sentence, "D2", details={**details, "generic": n})


def check_exact_across(
    splits: Splits,
    groups: list[DuplicateGroup],
    generic: GenericTexts | None = None,
    groups_apart: bool = False,
) -> Finding:
    """D2: an evaluation example equal to a training example measures memory, not learning.
    Generic short turns said in many groups are reported apart (WARN), never as a leak."""
    check = "exact duplicates across splits"
    repeated: dict[str, list[tuple[str, str]]] = {}
    formulas: list[str] = []
    n_generic = 0
    earlier_of = dict(_later(splits))
    for split, earlier in earlier_of.items():
        for g in groups:
            before = [i for s in earlier for i in g.members.get(s, [])]
            if before and g.members.get(split):
                if generic is not None and generic.is_generic(g.text):
                    n_generic += len(g.members[split])
                    formulas.append(g.text)
                    continue
                repeated.setdefault(split, []).extend((e, before[0]) for e in g.members[split])
    if not repeated:
        if n_generic and generic is not None:
            return _generic_finding(check, n_generic, generic, formulas, {})
        sentence = "no evaluation example equals an earlier split's example after normalisation"
        return Finding(check, PASS, sentence, "D2")
    parts = [
        f"{len(p)} {_noun(s)} examples equal a {_nouns(earlier_of[s])} example"
        for s, p in repeated.items()
    ]
    pairs = [p for ps in repeated.values() for p in ps]
    shown = ", ".join(f"{a} = {b}" for a, b in pairs[:3])
    fix = ("add `drop_exact_duplicates` to data.cleaning (the groups are already apart: the same "
           "text comes from different groups)" if groups_apart else
           "add `drop_exact_duplicates` to data.cleaning or split by group")  # fmt: skip
    sentence = (f"{' and '.join(parts)} after normalisation (e.g. {shown}); {fix}"
                + _generic_note(n_generic, generic, formulas))  # fmt: skip
    details = {
        "counts": {s: len(p) for s, p in repeated.items()},
        "pairs": [list(p) for p in pairs[:50]],
        "generic": n_generic,
    }
    ids = [a for a, _ in pairs[:SHOWN]]
    return Finding(check, FAIL, sentence, "D2", examples=ids, details=details)


def check_near_duplicates(
    splits: Splits,
    pairs: list[NearPair],
    threshold: float,
    generic: GenericTexts | None = None,
    groups_apart: bool = False,
) -> Finding:
    """D2: near copies (a word changed, a greeting added) leak like exact ones. WARN when some
    evaluation examples have one; FAIL above NEAR_FAIL_SHARE of an evaluation split. Pairs of
    generic short turns are counted apart and only WARN; the advice never asks for the group
    split when the groups are already apart."""
    check = "near duplicates across splits"
    formulas: list[NearPair] = []
    leaks: list[NearPair] = []
    for p in pairs:  # a short variant of a formula ("great, thank you ...") is one too
        formula = generic is not None and generic.is_pair_generic(p.text_a, p.text_b)
        (formulas if formula else leaks).append(p)
    generic_ids = {i for p in formulas for i in p.ids_b}
    pairs = leaks
    hit: dict[str, set[str]] = {s: set() for s, _ in _later(splits)}
    for p in pairs:
        hit.setdefault(p.split_b, set()).update(p.ids_b)
    hit = {s: ids for s, ids in hit.items() if ids}
    sample_text = [p.text_b for p in formulas]
    if not hit:
        if formulas and generic is not None:
            return _generic_finding(check, len(generic_ids), generic, sample_text,
                                    {"pairs": len(formulas)})  # fmt: skip
        sentence = (
            f"no evaluation example has a near copy (shingle Jaccard >= {threshold}) "
            "in an earlier split"
        )
        return Finding(check, PASS, sentence, "D2")
    shares = {s: len(ids) / len(splits[s]) for s, ids in hit.items()}
    verdict = FAIL if max(shares.values()) > NEAR_FAIL_SHARE else WARN
    counts = " and ".join(
        f"{len(ids)} {_noun(s)} examples ({shares[s]:.1%})" for s, ids in hit.items()
    )
    shown = "; ".join(f"{p.ids_b[0]} ~ {p.ids_a[0]}, J={p.jaccard:.2f}" for p in pairs[:3])
    if groups_apart:
        fix = ("the groups are already apart, so these come from different groups: read them and "
               "remove the copies, or declare a coarser data.fields.group if they share a source")
    elif verdict is FAIL:
        fix = "split by the unit they share (data.fields.group) or remove the copies"
    else:
        fix = "read them; remove the copies, or split by group if they share a source"
    sentence = (
        f"{counts} nearly repeat an earlier split's example (shingle Jaccard >= {threshold}; "
        f"e.g. {shown}); {fix}" + _generic_note(len(generic_ids), generic, sample_text)
    )
    sample = [
        {
            "a": p.ids_a[0],
            "b": p.ids_b[0],
            "jaccard": p.jaccard,
            "text_a": p.text_a[:200],
            "text_b": p.text_b[:200],
        }
        for p in pairs[:20]
    ]
    details = {
        "pairs": len(pairs),
        "examples_per_split": {s: len(ids) for s, ids in hit.items()},
        "share_per_split": {s: round(v, 4) for s, v in shares.items()},
        "sample": sample,
        "generic": len(generic_ids),
    }
    ids = [p.ids_b[0] for p in pairs[:SHOWN]]
    return Finding(check, verdict, sentence, "D2", examples=ids, details=details)


def check_group_leakage(splits: Splits, field: str | None) -> Finding:
    """D8: examples of one conversation, patient or document on both sides of a split let the
    model recognise the unit instead of solving the task."""
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
    sentence = (
        f"{' and '.join(parts)} (e.g. {', '.join(values[:3])}); "
        f"split by {field} (split.policy: group)"
    )
    details = {
        "examples_per_split": {s: len(ids) for s, ids in leaked.items()},
        "groups": len(values),
        "group_values": values[:50],
    }
    ids = [i for ids in leaked.values() for i in ids][:SHOWN]
    return Finding(check, FAIL, sentence, "D8", examples=ids, details=details)


def check_time_overlap(splits: Splits, field: str, policy: str) -> Finding:
    """D8: an evaluation example dated before the end of an earlier split lets the model see
    the future of what it is scored on. FAIL, except under a group split: there the declared
    unit is the group and the overlap is a WARN to weigh against how the model will be used."""
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
    else:
        fix = "use split.policy: time"
    counts = " and ".join(f"{len(ids)} {_noun(s)} examples" for s, ids in overlaps.items())
    first = _order(splits)[0]
    ends = f"{_noun(first)} ends {span[first][1]}"
    sentence = f"{counts} are dated no later than the end of an earlier split ({ends}); {fix}"
    details["examples_per_split"] = {s: len(ids) for s, ids in overlaps.items()}
    ids = [i for ids in overlaps.values() for i in ids][:SHOWN]
    return Finding(check, verdict, sentence, "D8", examples=ids, details=details)
