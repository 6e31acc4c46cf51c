"""Audit checks on labels and lengths: unseen labels, class balance, the label-id mapping
against an existing head (D6), and token lengths / truncation (D3, S6)."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from tunepilot.campaign.checks import POSITION_KEYS, position_limit
from tunepilot.campaign.schema import CLASSIFICATION_TASKS, AuditSettings
from tunepilot.errors import InputError
from tunepilot.tasks.example import SPLITS, Splits
from tunepilot.verdict import Finding, Verdict

SHOWN = 5  # example ids named in a finding
MIN_CLASS_EXAMPLES = 5  # fewer training examples than this: the class is barely learnable
_NOUN = {"train": "training", "validation": "validation", "test": "test"}
PASS, WARN, FAIL = Verdict.PASS, Verdict.WARN, Verdict.FAIL


def _order(splits: Splits) -> list[str]:
    """Non-empty splits, train / validation / test first."""
    known = [s for s in SPLITS if splits.get(s)]
    return known + sorted(s for s in splits if s not in SPLITS and splits[s])


def _later(splits: Splits) -> list[tuple[str, list[str]]]:
    """(evaluation split, the splits before it), e.g. ("test", ["train", "validation"])."""
    order = _order(splits)
    return [(split, order[:i]) for i, split in enumerate(order) if i > 0]


def _noun(split: str) -> str:
    return _NOUN.get(split, split)


def _nouns(splits: list[str]) -> str:
    return " or ".join(_noun(s) for s in splits)


def check_unseen_labels(splits: Splits) -> Finding:
    """D6/H2: a class in evaluation but absent from training cannot be learned, and its
    per-class guard can only fail."""
    check = "labels absent from training"
    trained = {ex.label for ex in splits.get("train", []) if ex.label}
    unseen = {
        s: Counter(ex.label for ex in splits[s] if ex.label and ex.label not in trained)
        for s, _ in _later(splits)
    }
    unseen = {s: c for s, c in unseen.items() if c}
    if not unseen:
        classes = f"{len(trained)} class" + ("" if len(trained) == 1 else "es")
        sentence = f"every evaluation label occurs in training ({classes})"
        return Finding(check, PASS, sentence, "D6, H2")
    names = sorted({n for c in unseen.values() for n in c})
    sentence = (
        f"{len(names)} label(s) occur in evaluation but never in training "
        f"({', '.join(names[:SHOWN])}); add training examples for them, or drop them from "
        "data.labels and the evaluation files"
    )
    ids = [ex.id for s in unseen for ex in splits[s] if ex.label in names][:SHOWN]
    details = {"unseen": {s: dict(c) for s, c in unseen.items()}}
    return Finding(check, FAIL, sentence, "D6, H2", examples=ids, details=details)


def check_class_balance(splits: Splits, label_names: list[str], audit: AuditSettings) -> Finding:
    """H2: per-class counts per split; WARN when the largest training class outnumbers the
    smallest by more than imbalance_warn_ratio, or a class has too few training examples."""
    counts = {s: Counter(ex.label for ex in splits[s] if ex.label) for s in _order(splits)}
    train = counts.get("train", Counter())
    names = [n for n in (label_names or sorted(train)) if train[n] > 0]
    details: dict[str, Any] = {"counts": {s: dict(sorted(c.items())) for s, c in counts.items()}}
    if not names:
        return Finding(
            "class balance", WARN, "no labelled training examples", "H2", details=details
        )
    if len(names) < 2:
        sentence = (
            f"training has a single class ({names[0]}, {train[names[0]]} examples): a classifier "
            "of one class learns nothing and every score is trivially perfect; check "
            "data.fields.label and the files, or give examples of at least two classes"
        )
        return Finding("class balance", FAIL, sentence, "H2, D6", details=details)
    big, small = max(names, key=train.__getitem__), min(names, key=train.__getitem__)
    ratio = details["ratio"] = round(train[big] / train[small], 2)
    seen = (
        f"training has {len(names)} classes from {train[small]} ({small}) to {train[big]} "
        f"({big}) examples, ratio {ratio:.1f}"
        if train[big] != train[small]
        else f"training has {len(names)} classes of {train[big]} examples each"
    )
    why = []
    if ratio > audit.imbalance_warn_ratio:
        why.append(f"above data.audit.imbalance_warn_ratio {audit.imbalance_warn_ratio:g}")
    few = [n for n in names if train[n] < MIN_CLASS_EXAMPLES]
    if few:
        why.append(
            f"{len(few)} class(es) under {MIN_CLASS_EXAMPLES} examples ({', '.join(few[:SHOWN])})"
        )
    if not why:
        return Finding("class balance", PASS, seen, "H2", details=details)
    fix = "watch the small classes' guards, add examples or merge classes"
    sentence = f"{seen}, {' and '.join(why)}; {fix}"
    return Finding("class balance", WARN, sentence, "H2", details=details)


def check_label_mapping(model_label_map: dict[Any, str], label_names: list[str]) -> Finding:
    """D6: a head trained with another class order still gives a finite loss, on the wrong
    task. Compares the model config's id2label with the data's names in id order.

    Generic names (LABEL_0 ...) mean a new or unnamed head; same names in another order FAIL
    at the first id that differs; wholly other names are a head for another task (replaced).
    """
    check = "label mapping"
    theirs = {int(k): str(v) for k, v in model_label_map.items()}
    ours = dict(enumerate(label_names))
    details = {"model": theirs, "data": ours}
    if all(v == f"LABEL_{k}" for k, v in theirs.items()):
        unnamed = len(theirs) == len(ours) and len(ours) != 2  # 2 = transformers' default
        sentence = (
            "the model's head has generic names (LABEL_0 ...): the head is new and its "
            f"{len(ours)} ids follow data.labels"
        )
        if unnamed:
            sentence += (
                f"; it already has {len(ours)} unnamed outputs: if it was trained, check that "
                "its ids follow data.labels"
            )
        return Finding(check, WARN if unnamed else PASS, sentence, "D6", details=details)
    if not set(theirs.values()) & set(ours.values()):
        sentence = (
            f"the model's head names other classes ({', '.join(list(theirs.values())[:3])}); "
            "it will be replaced by a new head for your labels"
        )
        return Finding(check, WARN, sentence, "D6", details=details)
    differ = [i for i in sorted(set(theirs) | set(ours)) if theirs.get(i) != ours.get(i)]
    if not differ:
        sentence = f"the model head and the data agree on all {len(ours)} class ids"
        return Finding(check, PASS, sentence, "D6", details=details)
    i = differ[0]
    model_says = f"`{theirs[i]}`" if i in theirs else "absent"
    data_says = f"`{ours[i]}`" if i in ours else "absent"
    sentence = (
        f"id {i} is {model_says} in the model but {data_says} in your data ({len(differ)} id(s) "
        "differ); set data.labels to the model's order, or start a new head"
    )
    ids = [str(j) for j in differ[:SHOWN]]
    return Finding(check, FAIL, sentence, "D6", examples=ids, details=details)


def _length_stats(lengths: list[int]) -> dict[str, int]:
    ordered = sorted(lengths)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"max": ordered[-1], "median": int(statistics.median(ordered)), "p95": p95}


def check_lengths(
    splits: Splits, encoder: Any, task: str, max_length: int, audit: AuditSettings
) -> Finding:
    """D3/S6: token lengths per split through the program's own encoder. Extraction/format:
    an answer cut by max_length is another experiment (FAIL). Classification: WARN when the
    truncated share exceeds data.audit.truncation_warn_share."""
    check = "length and truncation"
    stats: dict[str, dict[str, int]] = {}
    cut: list[tuple[str, int]] = []
    answer_cut: list[tuple[str, int]] = []
    cut_turns: list[tuple[str, int]] = []  # (conversation id, assistant turn number)
    failed: list[tuple[str, str]] = []
    for split in _order(splits):
        lengths = []
        for ex in splits[split]:
            try:
                enc = encoder.encode(ex)
            except InputError as err:  # not hidden: the finding below FAILs naming them
                failed.append((ex.id, str(err.problems[0]) if err.problems else str(err)))
                continue
            lengths.append(enc.full_length)
            if enc.truncated:
                cut.append((ex.id, enc.full_length))
            if enc.target_truncated:
                answer_cut.append((ex.id, enc.full_length))
                cut_turns += [(ex.id, n) for n in enc.cut_turns]
        if lengths:
            stats[split] = _length_stats(lengths)
    seen = "; ".join(
        f"{s} median {v['median']}, p95 {v['p95']}, max {v['max']}" for s, v in stats.items()
    )
    share = len(cut) / max(1, sum(len(splits[s]) for s in _order(splits)) - len(failed))
    details: dict[str, Any] = {"max_length": max_length, "per_split": stats, "truncated": len(cut)}
    details.update(truncated_share=round(share, 4), target_truncated=len(answer_cut))
    if failed:
        sentence = f"{len(failed)} examples cannot be encoded (e.g. {failed[0][1]}); fix them first"
        ids = [i for i, _ in failed[:SHOWN]]
        details["unencodable"] = failed[:50]
        return Finding(check, FAIL, sentence, "D3", examples=ids, details=details)
    if answer_cut and task not in CLASSIFICATION_TASKS:
        needed = details["needed_max_length"] = max(n for _, n in answer_cut)
        shown = ", ".join(i for i, _ in answer_cut[:3])
        if cut_turns:  # conversations: say which assistant turns lose tokens
            details["cut_turns"] = [[i, n] for i, n in cut_turns[:50]]
            shown = ", ".join(f"{i} assistant turn {n}" for i, n in cut_turns[:3])
            shown = f"{len(cut_turns)} assistant turns in all; {shown}"
        sentence = (
            f"{len(answer_cut)} examples lose answer tokens at max_length {max_length} (e.g. "
            f"{shown}); the longest needs {needed}: raise "
            f"data.max_length to {needed} or shorten the prompt; a fit bought by cutting the "
            "answer is not the same experiment"
        )
        ids = [i for i, _ in answer_cut[:SHOWN]]
        return Finding(check, FAIL, sentence, "D3, S6", examples=ids, details=details)
    ids = [i for i, _ in cut[:SHOWN]]
    if share > audit.truncation_warn_share:
        needed = details["needed_max_length"] = max(n for _, n in cut)
        sentence = (
            f"{len(cut)} examples ({share:.1%}) are cut at max_length {max_length} (tokens: "
            f"{seen}); the longest needs {needed}: raise data.max_length if the end of the "
            "text can decide the answer"
        )
        return Finding(check, WARN, sentence, "D3, S6", examples=ids, details=details)
    sentence = f"tokens per example: {seen}; {len(cut)} cut at max_length {max_length}"
    return Finding(check, PASS, sentence, "D3, S6", examples=ids, details=details)


def check_position_limit(max_length: int, model_config: dict[str, Any]) -> Finding:
    """S6: a `max_length` beyond the positions the model has crashes the run with a size
    mismatch (learned position tables) or runs outside the trained context (rotary ones), so
    the setting is refused before any rental. Read from the model's config.json."""
    check = "max_length vs the model's positions"
    found = position_limit(model_config)
    if found is None:
        sentence = (
            f"cannot check data.max_length {max_length}: the model's config.json names no "
            f"position limit ({', '.join(POSITION_KEYS)})"
        )
        return Finding(check, WARN, sentence, "S6")
    key, limit = found
    details = {"max_length": max_length, "limit": limit, "config_key": key}
    if max_length <= limit:
        sentence = f"data.max_length {max_length} is within the model's {key} {limit}"
        return Finding(check, PASS, sentence, "S6", details=details)
    sentence = (
        f"data.max_length {max_length} exceeds the model's {key} {limit} (config.json): an "
        f"input longer than {limit} tokens crashes the run with a size mismatch or runs "
        f"outside the positions the model was trained on; set data.max_length to at most {limit}"
    )
    if model_config.get("rope_scaling"):
        sentence += " (or confirm the config's rope_scaling covers it)"
        return Finding(check, WARN, sentence, "S6", details=details)
    return Finding(check, FAIL, sentence, "S6", details=details)
