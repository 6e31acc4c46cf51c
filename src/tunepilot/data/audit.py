"""The data audit: what could make a campaign's numbers lie, found before compute is spent.

Each check is a small function that returns one `Finding` (PASS / WARN / FAIL, one sentence
saying what was seen and what to do, a few example ids, the SPEC requirement ids):

- cleaning rules and what they changed (D1)
- exact duplicates within a split and across splits, near duplicates across splits (D2)
- group leakage and overlapping time periods between splits (D8)
- evaluation labels never seen in training, class balance (D6, H2)
- the model head's label mapping against the data's (D6)
- token lengths and truncation, answer tokens cut by max_length (D3, S6)

"Across splits" always means a later split repeating an earlier one, in the order train,
validation, test: a test example equal to a training example is what inflates the score.
Pure Python + numpy: no torch here; the encoder, when given, brings its own tokenizer.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from tunepilot.campaign import DataSettings
from tunepilot.campaign.schema import AuditSettings
from tunepilot.data.dedup import (
    DuplicateGroup,
    NearPair,
    build_index,
    exact_duplicates,
    near_duplicates,
)
from tunepilot.data.example import Splits
from tunepilot.data.prepared import PreparedData, RuleCount
from tunepilot.data.split import time_key
from tunepilot.errors import InputError
from tunepilot.verdict import Finding, Verdict, worst

SHOWN = 5  # example ids / pairs named in a sentence or a finding
NEAR_FAIL_SHARE = 0.05  # near duplicates above this share of an evaluation split: FAIL
MIN_CLASS_EXAMPLES = 5  # fewer training examples than this: the class cannot be learned

_SPLIT_NOUN = {"train": "training", "validation": "validation", "test": "test"}


def run_audit(
    prepared: PreparedData,
    data: DataSettings,
    task: str,
    encoder: Any = None,
    model_label_map: dict[int, str] | None = None,
) -> list[Finding]:
    """Every audit check over the prepared splits, in reading order."""
    splits = prepared.splits
    index = build_index(splits)
    groups = exact_duplicates(splits, index=index)
    pairs = near_duplicates(
        splits,
        threshold=data.audit.near_duplicate_threshold,
        shingle_size=data.audit.shingle_size,
        index=index,
    )
    findings = [
        check_cleaning(prepared.cleaning),
        check_exact_within(splits, groups),
        check_exact_across(splits, groups),
        check_near_duplicates(splits, pairs, data.audit.near_duplicate_threshold),
        check_group_leakage(splits, data.fields.group),
    ]
    if data.fields.time:
        findings.append(check_time_overlap(splits, data.fields.time, data.split.policy))
    if task == "classification":
        findings.append(check_unseen_labels(splits))
        findings.append(check_class_balance(splits, prepared.label_names, data.audit))
        if model_label_map is not None:
            findings.append(check_label_mapping(model_label_map, prepared.label_names))
    if encoder is not None:
        findings.append(check_lengths(splits, encoder, task, data.max_length, data.audit))
    return findings


def audit_to_json(findings: list[Finding]) -> dict[str, Any]:
    """The audit as written to audit.json: the overall verdict, counts, every finding."""
    counts = Counter(str(f.verdict) for f in findings)
    return {
        "verdict": str(worst(findings)),
        "counts": {v.value: counts.get(v.value, 0) for v in Verdict},
        "findings": [f.to_json() for f in findings],
    }


def _order(splits: Splits) -> list[str]:
    return [s for s in ("train", "validation", "test") if splits.get(s)] + sorted(
        s for s in splits if s not in ("train", "validation", "test") and splits[s]
    )


def _earlier_noun(earlier: list[str]) -> str:
    return " or ".join(_SPLIT_NOUN.get(s, s) for s in earlier)


# --------------------------------------------------------------------------------------------
# D1: cleaning
# --------------------------------------------------------------------------------------------


def check_cleaning(counts: list[RuleCount]) -> Finding:
    """D1: every declared rule with what it changed or dropped (informative, always PASS)."""
    if not counts:
        return Finding("cleaning", Verdict.PASS, "no cleaning rules declared", "D1")
    parts = [
        f"{c.rule} changed {c.changed}" + (f", dropped {c.dropped}" if c.dropped else "")
        for c in counts
    ]
    ids = [i for c in counts for i in c.example_ids][:SHOWN]
    return Finding(
        "cleaning",
        Verdict.PASS,
        "cleaning applied in order: " + "; ".join(parts),
        "D1",
        examples=ids,
        details={"rules": [vars(c) for c in counts]},
    )


# --------------------------------------------------------------------------------------------
# D2: duplicates
# --------------------------------------------------------------------------------------------


def check_exact_within(splits: Splits, groups: list[DuplicateGroup]) -> Finding:
    """D2: a text repeated inside a split weighs more in training and counts twice in scores."""
    extra: dict[str, int] = {}
    shown: list[str] = []
    for split in _order(splits):
        inside = [g for g in groups if g.within(split)]
        if inside:
            extra[split] = sum(len(g.members[split]) - 1 for g in inside)
            shown += [" = ".join(g.members[split][:2]) for g in inside[:2]]
    if not extra:
        return Finding(
            "exact duplicates within splits",
            Verdict.PASS,
            "no split repeats a text after normalisation",
            "D2",
        )
    counts = ", ".join(f"{s} {n}" for s, n in extra.items())
    return Finding(
        "exact duplicates within splits",
        Verdict.WARN,
        f"extra copies of a text inside a split after normalisation: {counts} "
        f"(e.g. {'; '.join(shown[:3])}); add `drop_exact_duplicates` to data.cleaning",
        "D2",
        examples=[i for pair in shown[:SHOWN] for i in pair.split(" = ")][:SHOWN],
        details={"extra_rows": extra},
    )


def check_exact_across(splits: Splits, groups: list[DuplicateGroup]) -> Finding:
    """D2: an evaluation example equal to a training example measures memory, not learning."""
    order = _order(splits)
    repeated: dict[str, list[tuple[str, str]]] = {}
    for g in groups:
        if not g.cross_split:
            continue
        for i, split in enumerate(order[1:], start=1):
            earlier = [i for s in order[:i] for i in g.members.get(s, [])]
            if earlier:
                repeated.setdefault(split, []).extend(
                    (e, earlier[0]) for e in g.members.get(split, [])
                )
    if not repeated:
        return Finding(
            "exact duplicates across splits",
            Verdict.PASS,
            "no evaluation example equals an earlier split's example after normalisation",
            "D2",
        )
    parts = [
        f"{len(pairs)} {_SPLIT_NOUN.get(s, s)} examples equal a "
        f"{_earlier_noun(order[: order.index(s)])} example"
        for s, pairs in repeated.items()
    ]
    first = [p for pairs in repeated.values() for p in pairs]
    return Finding(
        "exact duplicates across splits",
        Verdict.FAIL,
        f"{' and '.join(parts)} after normalisation "
        f"(e.g. {', '.join(f'{a} = {b}' for a, b in first[:3])}); "
        "add `drop_exact_duplicates` to data.cleaning or split by group",
        "D2",
        examples=[a for a, _ in first[:SHOWN]],
        details={
            "counts": {s: len(p) for s, p in repeated.items()},
            "pairs": [list(p) for p in first[:50]],
        },
    )


def check_near_duplicates(splits: Splits, pairs: list[NearPair], threshold: float) -> Finding:
    """D2: near copies (a word changed, a greeting added) leak like exact ones. WARN when
    some evaluation examples have one; FAIL above NEAR_FAIL_SHARE of an evaluation split."""
    hit: dict[str, set[str]] = {}
    for p in pairs:
        hit.setdefault(p.split_b, set()).update(p.ids_b)
    if not hit:
        return Finding(
            "near duplicates across splits",
            Verdict.PASS,
            f"no evaluation example has a near copy (shingle Jaccard >= {threshold}) "
            "in an earlier split",
            "D2",
        )
    shares = {s: len(ids) / max(1, len(splits[s])) for s, ids in hit.items()}
    verdict = Verdict.FAIL if max(shares.values()) > NEAR_FAIL_SHARE else Verdict.WARN
    counts = " and ".join(
        f"{len(ids)} {_SPLIT_NOUN.get(s, s)} examples ({shares[s]:.1%})" for s, ids in hit.items()
    )
    shown = "; ".join(f"{p.ids_b[0]} ~ {p.ids_a[0]}, J={p.jaccard:.2f}" for p in pairs[:3])
    fix = (
        "split by the unit they share (data.fields.group) or remove the copies"
        if verdict is Verdict.FAIL
        else "look at them; remove the copies or split by group if they share a source"
    )
    return Finding(
        "near duplicates across splits",
        verdict,
        f"{counts} nearly repeat an earlier split's example (shingle Jaccard >= {threshold}; "
        f"e.g. {shown}); {fix}",
        "D2",
        examples=[p.ids_b[0] for p in pairs[:SHOWN]],
        details={
            "pairs": len(pairs),
            "examples_per_split": {s: len(ids) for s, ids in hit.items()},
            "share_per_split": {s: round(v, 4) for s, v in shares.items()},
            "sample": [
                {
                    "a": p.ids_a[0],
                    "b": p.ids_b[0],
                    "jaccard": p.jaccard,
                    "text_a": p.text_a[:200],
                    "text_b": p.text_b[:200],
                }
                for p in pairs[:20]
            ],
        },
    )


# --------------------------------------------------------------------------------------------
# D8: leakage by unit and by time
# --------------------------------------------------------------------------------------------


def check_group_leakage(splits: Splits, field: str | None) -> Finding:
    """D8: examples of one conversation, patient or document on both sides of a split let
    the model recognise the unit instead of solving the task."""
    if not field:
        return Finding(
            "group leakage",
            Verdict.WARN,
            "no leakage unit declared, so examples of one conversation, patient or document "
            "may sit in both training and evaluation unchecked; set data.fields.group "
            "(and split.policy: group) if your examples come in such units",
            "D8",
        )
    order = _order(splits)
    seen_in: dict[str, str] = {}
    leaked: dict[str, list[str]] = {}
    leaked_groups: dict[str, list[str]] = {}
    for split in order:
        here = {ex.group for ex in splits[split] if ex.group is not None}
        for ex in splits[split]:
            if ex.group is not None and seen_in.get(ex.group, split) != split:
                leaked.setdefault(split, []).append(ex.id)
        leaked_groups[split] = sorted(g for g in here if seen_in.get(g, split) != split)
        for g in here:
            seen_in.setdefault(g, split)
    if not any(leaked.values()):
        n_groups = len(seen_in)
        return Finding(
            "group leakage",
            Verdict.PASS,
            f"each of {n_groups} {field} values sits in one split only",
            "D8",
            details={"groups": n_groups},
        )
    parts = [
        f"{len(ids)} {_SPLIT_NOUN.get(s, s)} examples share {field} with "
        f"{_earlier_noun(order[: order.index(s)])}"
        for s, ids in leaked.items()
    ]
    values = [g for s in leaked for g in leaked_groups[s]]
    return Finding(
        "group leakage",
        Verdict.FAIL,
        f"{' and '.join(parts)} (e.g. {', '.join(values[:3])}); split by {field} "
        "(split.policy: group)",
        "D8",
        examples=[i for ids in leaked.values() for i in ids][:SHOWN],
        details={
            "examples_per_split": {s: len(ids) for s, ids in leaked.items()},
            "groups_per_split": {s: len(leaked_groups[s]) for s in leaked},
            "groups": values[:50],
        },
    )


def check_time_overlap(splits: Splits, field: str, policy: str) -> Finding:
    """D8: an evaluation example dated before the end of training lets the model see the
    future of what it is scored on. FAIL, except under a group split, where the declared
    unit is the group and the overlap is reported as a WARN to weigh."""
    order = _order(splits)
    keys: dict[str, list[tuple[tuple[int, float], str, str]]] = {}
    bad: list[str] = []
    for split in order:
        for ex in splits[split]:
            key = time_key(ex.time)
            if key is None:
                bad.append(ex.id)
            else:
                keys.setdefault(split, []).append((key, ex.time or "", ex.id))
    if bad:
        return Finding(
            "time overlap",
            Verdict.WARN,
            f"{len(bad)} examples have no readable {field} (e.g. "
            f"{', '.join(bad[:3])}); write ISO 8601 times to check periods",
            "D8",
            examples=bad[:SHOWN],
        )
    kinds = {k[0][0] for rows in keys.values() for k in rows}
    if len(kinds) > 1:
        return Finding(
            "time overlap",
            Verdict.WARN,
            f"{field} mixes numbers, naive and timezone-aware times; write them "
            "one way to check periods",
            "D8",
        )
    periods = {s: (min(rows), max(rows)) for s, rows in keys.items()}
    overlaps: dict[str, list[str]] = {}
    for i, split in enumerate(order[1:], start=1):
        end = max((periods[s][1] for s in order[:i] if s in periods), default=None)
        if end is None or split not in keys:
            continue
        early = [r for r in keys[split] if r[0] <= end[0]]
        if early:
            overlaps[split] = [r[2] for r in sorted(early)]
    span = {s: [p[0][1], p[1][1]] for s, p in periods.items()}
    if not overlaps:
        return Finding(
            "time overlap",
            Verdict.PASS,
            "each split's period starts after the previous one ends ("
            + "; ".join(f"{s} {a} .. {b}" for s, (a, b) in span.items())
            + ")",
            "D8",
            details={"periods": span},
        )
    verdict = Verdict.WARN if policy == "group" else Verdict.FAIL
    parts = [f"{len(ids)} {_SPLIT_NOUN.get(s, s)} examples" for s, ids in overlaps.items()]
    fix = (
        "the split is by group; if the model will meet only later data, use split.policy: time"
        if verdict is Verdict.WARN
        else "use split.policy: time"
    )
    return Finding(
        "time overlap",
        verdict,
        f"{' and '.join(parts)} are dated no later than the end of an earlier split "
        f"({'; '.join(f'{s} {a} .. {b}' for s, (a, b) in span.items())}); {fix}",
        "D8",
        examples=[i for ids in overlaps.values() for i in ids][:SHOWN],
        details={"periods": span, "examples_per_split": {s: len(v) for s, v in overlaps.items()}},
    )


# --------------------------------------------------------------------------------------------
# D6, H2: labels
# --------------------------------------------------------------------------------------------


def check_unseen_labels(splits: Splits) -> Finding:
    """D6/H2: a class present in evaluation but absent from training cannot be learned, and
    its per-class guard can only fail."""
    trained = {ex.label for ex in splits.get("train", []) if ex.label is not None}
    unseen: dict[str, Counter[str]] = {}
    for split in _order(splits)[1:]:
        missing = Counter(ex.label for ex in splits[split] if ex.label not in trained)
        missing.pop(None, None)  # type: ignore[call-overload]
        if missing:
            unseen[split] = missing
    if not unseen:
        return Finding(
            "labels absent from training",
            Verdict.PASS,
            f"every evaluation label occurs in training ({len(trained)} classes)",
            "D6, H2",
        )
    names = sorted({name for c in unseen.values() for name in c})
    ids = [ex.id for s in unseen for ex in splits[s] if ex.label in names]
    return Finding(
        "labels absent from training",
        Verdict.FAIL,
        f"{len(names)} label(s) occur in evaluation but never in training "
        f"({', '.join(names[:SHOWN])}); add training examples for them or drop them "
        "from data.labels and the evaluation files",
        "D6, H2",
        examples=ids[:SHOWN],
        details={"unseen": {s: dict(c) for s, c in unseen.items()}},
    )


def check_class_balance(splits: Splits, label_names: list[str], audit: AuditSettings) -> Finding:
    """H2: per-class counts per split; WARN when the largest training class outnumbers the
    smallest by more than imbalance_warn_ratio or a class has too few training examples."""
    counts = {
        s: Counter(ex.label for ex in splits[s] if ex.label is not None) for s in _order(splits)
    }
    train = counts.get("train", Counter())
    names = list(label_names) or sorted(train)
    present = [train[n] for n in names if train[n] > 0]
    details = {"counts": {s: dict(sorted(c.items())) for s, c in counts.items()}}
    if not present:
        return Finding(
            "class balance", Verdict.WARN, "no labelled training examples", "H2", details=details
        )
    ratio = max(present) / min(present)
    few = [n for n in names if 0 < train[n] < MIN_CLASS_EXAMPLES]
    largest = max(names, key=lambda n: train[n])
    smallest = min((n for n in names if train[n] > 0), key=lambda n: train[n])
    seen = (
        f"training has {len(present)} classes from {train[smallest]} ({smallest}) to "
        f"{train[largest]} ({largest}) examples, ratio {ratio:.1f}"
    )
    details["ratio"] = round(ratio, 2)
    if ratio > audit.imbalance_warn_ratio or few:
        why = []
        if ratio > audit.imbalance_warn_ratio:
            why.append(f"above data.audit.imbalance_warn_ratio {audit.imbalance_warn_ratio:g}")
        if few:
            why.append(
                f"{len(few)} class(es) under {MIN_CLASS_EXAMPLES} examples "
                f"({', '.join(few[:SHOWN])})"
            )
        return Finding(
            "class balance",
            Verdict.WARN,
            f"{seen}, {' and '.join(why)}; watch the per-class guards of the small "
            "classes, add examples or merge classes",
            "H2",
            details=details,
        )
    return Finding("class balance", Verdict.PASS, seen, "H2", details=details)


def check_label_mapping(model_label_map: dict[Any, str], label_names: list[str]) -> Finding:
    """D6: a head trained with another class order gives a finite loss on the wrong task.

    Compares the model config's id2label with the data's names in id order. Generic names
    (LABEL_0, ...) mean the head is new (or unnamed). Same names in another order: FAIL at the
    first id that differs. Entirely different names: a head for another task, to be replaced.
    """
    theirs = {int(k): str(v) for k, v in model_label_map.items()}
    ours = dict(enumerate(label_names))
    details = {"model": theirs, "data": ours}
    generic = all(v == f"LABEL_{k}" for k, v in theirs.items())
    if generic:
        verdict = Verdict.WARN if len(theirs) == len(ours) and len(ours) != 2 else Verdict.PASS
        extra = (
            f"; it already has {len(theirs)} unnamed outputs, so if it was trained make sure "
            "its ids follow data.labels"
            if verdict is Verdict.WARN
            else ""
        )
        return Finding(
            "label mapping",
            verdict,
            f"the model's head has generic names (LABEL_0 ...): the head is new and "
            f"its {len(ours)} ids follow data.labels{extra}",
            "D6",
            details=details,
        )
    if not set(theirs.values()) & set(ours.values()):
        return Finding(
            "label mapping",
            Verdict.WARN,
            f"the model's head names other classes ({', '.join(list(theirs.values())[:3])}"
            "); it will be replaced by a new head for your labels",
            "D6",
            details=details,
        )
    mismatch = [i for i in sorted(set(theirs) | set(ours)) if theirs.get(i) != ours.get(i)]
    if not mismatch:
        return Finding(
            "label mapping",
            Verdict.PASS,
            f"the model head and the data agree on all {len(ours)} class ids",
            "D6",
            details=details,
        )
    i = mismatch[0]
    model_says = f"`{theirs[i]}`" if i in theirs else "absent"
    data_says = f"`{ours[i]}`" if i in ours else "absent"
    return Finding(
        "label mapping",
        Verdict.FAIL,
        f"id {i} is {model_says} in the model but {data_says} in your data "
        f"({len(mismatch)} id(s) differ); set data.labels to the model's order "
        "(or start a new head)",
        "D6",
        examples=[str(j) for j in mismatch[:SHOWN]],
        details=details,
    )


# --------------------------------------------------------------------------------------------
# D3, S6: lengths and truncation
# --------------------------------------------------------------------------------------------


def _length_stats(lengths: list[int]) -> dict[str, int]:
    ordered = sorted(lengths)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {"max": ordered[-1], "median": int(statistics.median(ordered)), "p95": p95}


def check_lengths(
    splits: Splits, encoder: Any, task: str, max_length: int, audit: AuditSettings
) -> Finding:
    """D3/S6: per split token lengths through the program's own encoder. Extraction/format:
    an answer cut by max_length is another experiment (FAIL). Classification: WARN when the
    truncated share exceeds data.audit.truncation_warn_share."""
    stats: dict[str, dict[str, int]] = {}
    truncated: list[tuple[str, int]] = []
    target_cut: list[tuple[str, int]] = []
    unencodable: list[tuple[str, str]] = []
    total = 0
    for split in _order(splits):
        lengths = []
        for ex in splits[split]:
            try:
                enc = encoder.encode(ex)
            except InputError as err:  # reported below as a FAIL, with the first problem
                unencodable.append((ex.id, str(err.problems[0]) if err.problems else str(err)))
                continue
            lengths.append(enc.full_length)
            if enc.truncated:
                truncated.append((ex.id, enc.full_length))
            if enc.target_truncated:
                target_cut.append((ex.id, enc.full_length))
        total += len(lengths)
        if lengths:
            stats[split] = _length_stats(lengths)
    seen = "; ".join(
        f"{s} median {v['median']}, p95 {v['p95']}, max {v['max']}" for s, v in stats.items()
    )
    details: dict[str, Any] = {
        "max_length": max_length,
        "per_split": stats,
        "truncated": len(truncated),
        "target_truncated": len(target_cut),
    }
    if unencodable:
        return Finding(
            "length and truncation",
            Verdict.FAIL,
            f"{len(unencodable)} examples cannot be encoded (e.g. "
            f"{unencodable[0][1]}); fix them before sizing",
            "D3",
            examples=[i for i, _ in unencodable[:SHOWN]],
            details={**details, "unencodable": unencodable[:50]},
        )
    share = len(truncated) / max(1, total)
    details["truncated_share"] = round(share, 4)
    if target_cut and task != "classification":
        needed = max(n for _, n in target_cut)
        return Finding(
            "length and truncation",
            Verdict.FAIL,
            f"{len(target_cut)} examples lose answer tokens at max_length {max_length} "
            f"(e.g. {', '.join(i for i, _ in target_cut[:3])}); the longest needs {needed}: "
            f"raise data.max_length to {needed} or shorten the prompt; a fit bought by cutting "
            "the answer is not the same experiment",
            "D3, S6",
            examples=[i for i, _ in target_cut[:SHOWN]],
            details={**details, "needed_max_length": needed},
        )
    if share > audit.truncation_warn_share:
        needed = max(n for _, n in truncated)
        return Finding(
            "length and truncation",
            Verdict.WARN,
            f"{len(truncated)} examples ({share:.1%}) are cut at max_length {max_length} "
            f"(tokens: {seen}); the longest needs {needed}: raise data.max_length if the end "
            "of the text decides the answer",
            "D3, S6",
            examples=[i for i, _ in truncated[:SHOWN]],
            details={**details, "needed_max_length": needed},
        )
    return Finding(
        "length and truncation",
        Verdict.PASS,
        f"tokens per example: {seen}; {len(truncated)} cut at max_length {max_length}",
        "D3, S6",
        examples=[i for i, _ in truncated[:SHOWN]],
        details=details,
    )
