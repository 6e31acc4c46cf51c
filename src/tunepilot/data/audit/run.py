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
from tunepilot.data.audit.answers import check_gold_answers
from tunepilot.data.audit.chat import (
    check_same_user_turns,
    check_shared_openings,
    check_turn_end,
)
from tunepilot.data.audit.conflicts import check_conflicting_answers, check_label_spellings
from tunepilot.data.audit.dedup import DuplicateGroup, NearPair, build_index, exact_duplicates
from tunepilot.data.audit.dedup import near_duplicates as find_near_duplicates
from tunepilot.data.audit.labels import (
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
from tunepilot.data.audit.leakage import check_target_leakage
from tunepilot.data.audit.shape import check_rows_built_alike
from tunepilot.data.audit.tokens import EncodingMemo, check_special_tokens
from tunepilot.data.audit.units import check_group_leakage, check_time_overlap
from tunepilot.data.generic import GenericTexts, generic_texts
from tunepilot.data.prepared import PreparedData, RuleCount
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
    encoder = EncodingMemo(encoder) if encoder is not None else None  # one encoding per row
    index = build_index(splits)  # one normalisation pass shared by both duplicate searches
    groups = exact_duplicates(splits, index=index)
    threshold = audit.near_duplicate_threshold
    pairs = find_near_duplicates(splits, threshold, audit.shingle_size, index=index)
    leakage = check_group_leakage(splits, data.fields.group, data.split.policy)
    generic = prepared.generic or generic_texts(splits, data.fields.group)
    apart = data.fields.group is not None and leakage.verdict is PASS
    findings = [
        check_cleaning(prepared.cleaning),
        check_exact_within(splits, groups),
        check_exact_across(splits, groups, generic, apart),
        check_near_duplicates(splits, pairs, threshold, generic, apart),
        leakage,
        check_conflicting_answers(splits, groups, prepared.cleaning, task,
                                  generic.is_generic if generic is not None else None),
        check_target_leakage(splits, task, audit.target_leak_share,
                             data.chat.assistant_turns if data.chat is not None else "last"),
    ]  # fmt: skip
    if task not in CLASSIFICATION_TASKS:
        findings.append(check_rows_built_alike(splits))
    if data.chat is not None:
        findings.append(check_same_user_turns(splits))
        if data.split.policy != "group":  # under a group split the group check covers it
            findings.append(check_shared_openings(splits))
        if encoder is not None:
            findings.append(check_turn_end(splits, encoder))
    if data.fields.time:
        findings.append(check_time_overlap(splits, data.fields.time, data.split.policy,
                                           data.fields.group))  # fmt: skip
    if task in CLASSIFICATION_TASKS:
        findings.append(check_label_spellings(splits, data.labels))
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
        findings.append(check_special_tokens(splits, encoder))
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
        + (f" ({len(c.conflicts)} of them with another label or answer than the copy kept: "
           "see `conflicting labels`)" if c.conflicts else "")
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
