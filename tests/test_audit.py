"""The data audit's checks (D1, D2, D3, D6, D8, H2, S6): each verdict, sentence and example ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunepilot.campaign import DataSettings
from tunepilot.data.audit.run import (
    audit_to_json,
    check_class_balance,
    check_label_mapping,
    check_time_overlap,
    run_audit,
)
from tunepilot.data.prepared import PreparedData, RuleCount
from tunepilot.tasks.example import Example
from tunepilot.verdict import Verdict

PASS, WARN, FAIL = Verdict.PASS, Verdict.WARN, Verdict.FAIL


def ex(i: str, text: str, label: str | None = "a", group=None, time=None, target=None):
    return Example(
        id=i, text=text, source=f"f:{i}", label=label, group=group, time=time, target=target
    )


def prepared(splits, label_names=None, cleaning=None) -> PreparedData:
    return PreparedData(
        splits={s: splits.get(s, []) for s in ("train", "validation", "test")},
        version="v",
        label_names=label_names or [],
        cleaning=cleaning or [],
        split_policy={},
    )


def data(**kw) -> DataSettings:
    return DataSettings.model_validate({"file": "x.jsonl", **kw})


def by_check(findings):
    return {f.check: f for f in findings}


def distinct(n: int, prefix: str, label: str = "a", **kw) -> list[Example]:
    """n unrelated texts: each has its own words, so no exact or near duplicates."""
    return [
        ex(f"{prefix}{i}", f"{prefix} number {i} says {i * 7} things about {i * 13}", label, **kw)
        for i in range(n)
    ]


LONG = "my card was charged twice for the same order please refund the second payment soon"


def test_d1_cleaning_rules_are_listed_with_their_counts():
    counts = [
        RuleCount("strip", changed=3, example_ids=["t1"]),
        RuleCount("drop_exact_duplicates", dropped=2),
    ]
    f = by_check(
        run_audit(prepared({"train": distinct(3, "t")}, cleaning=counts), data(), "format")
    )["cleaning"]
    assert f.verdict is PASS and f.requirement == "D1"
    assert (
        f.sentence
        == "cleaning applied in order: strip changed 3; drop_exact_duplicates changed 0, dropped 2"
    )
    assert f.examples == ["t1"] and f.details["rules"][1]["dropped"] == 2


def test_d2_exact_duplicates_across_splits_fail_naming_both_ids():
    splits = {
        "train": [*distinct(5, "t"), ex("t-dup", "Where is my card?")],
        "validation": [*distinct(4, "v"), ex("v-dup", "  where is my CARD?")],
        "test": [
            *distinct(3, "s"),
            ex("s-dup", "where is my card?"),
            ex("s-dup2", "Where  is my card?"),
        ],
    }
    f = by_check(run_audit(prepared(splits), data(), "format"))["exact duplicates across splits"]
    assert f.verdict is FAIL and f.requirement == "D2"
    assert f.details["counts"] == {"validation": 1, "test": 2}
    assert f.sentence.startswith(
        "1 validation examples equal a training example and 2 test examples equal a training "
        "or validation example after normalisation (e.g. v-dup = t-dup, s-dup = t-dup"
    )
    assert "add `drop_exact_duplicates` to data.cleaning or split by group" in f.sentence
    assert f.examples == ["v-dup", "s-dup", "s-dup2"]


def test_d2_exact_duplicates_inside_a_split_warn_and_a_clean_split_passes():
    splits = {
        "train": [*distinct(4, "t"), ex("t-a", "Same text"), ex("t-b", "same  text")],
        "test": distinct(2, "s"),
    }
    found = by_check(run_audit(prepared(splits), data(), "format"))
    within = found["exact duplicates within splits"]
    assert within.verdict is WARN and within.details["extra_rows"] == {"train": 1}
    assert "(e.g. t-a = t-b)" in within.sentence
    assert found["exact duplicates across splits"].verdict is PASS
    assert found["near duplicates across splits"].verdict is PASS


def test_d2_near_duplicates_across_splits_warn_below_and_fail_above_the_share():
    near = LONG.replace("soon", "today")
    train = [*distinct(40, "t"), ex("t-long", LONG)]
    few = {"train": train, "validation": [*distinct(39, "v"), ex("v-near", near)]}  # 1 of 40
    f = by_check(run_audit(prepared(few), data(), "format"))["near duplicates across splits"]
    assert f.verdict is WARN and f.requirement == "D2"
    assert f.sentence.startswith(
        "1 validation examples (2.5%) nearly repeat an earlier split's example"
    )
    assert "e.g. v-near ~ t-long, J=0.86" in f.sentence and f.examples == ["v-near"]
    many = {"train": train, "validation": [*distinct(9, "v"), ex("v-near", near)]}  # 1 of 10
    f = by_check(run_audit(prepared(many), data(), "format"))["near duplicates across splits"]
    assert f.verdict is FAIL and f.details["share_per_split"] == {"validation": 0.1}
    assert "split by the unit they share" in f.sentence


def test_d2_near_duplicate_threshold_comes_from_the_campaign():
    near = LONG.replace("soon", "today")  # Jaccard 12/14 = 0.857
    splits = {
        "train": [*distinct(40, "t"), ex("t-long", LONG)],
        "validation": [*distinct(39, "v"), ex("v", near)],
    }
    strict = data(audit={"near_duplicate_threshold": 0.9})
    assert (
        by_check(run_audit(prepared(splits), strict, "format"))[
            "near duplicates across splits"
        ].verdict
        is PASS
    )


def test_d8_group_leakage_fails_naming_the_shared_groups():
    splits = {
        "train": [ex("t1", "a b c", group="c-1"), ex("t2", "d e f", group="c-2")],
        "validation": [ex("v1", "g h i", group="c-1"), ex("v2", "j k l", group="c-3")],
        "test": [ex("s1", "m n o", group="c-3"), ex("s2", "p q r", group="c-4")],
    }
    f = by_check(run_audit(prepared(splits), data(fields={"group": "conversation_id"}), "format"))[
        "group leakage"
    ]
    assert f.verdict is FAIL and f.requirement == "D8"
    assert f.sentence == (
        "1 validation examples share conversation_id with training and 1 test examples share "
        "conversation_id with training or validation (e.g. c-1, c-3); split by conversation_id "
        "(split.policy: group)"
    )
    assert f.examples == ["v1", "s1"] and f.details["groups"] == 2


def test_d8_group_leakage_passes_when_no_group_straddles_and_warns_without_a_group_field():
    splits = {"train": [ex("t1", "a b c", group="c-1")], "test": [ex("s1", "d e f", group="c-2")]}
    f = by_check(run_audit(prepared(splits), data(fields={"group": "conversation_id"}), "format"))[
        "group leakage"
    ]
    assert (
        f.verdict is PASS
        and f.sentence == "each of 2 conversation_id values sits in one split only"
    )
    f = by_check(run_audit(prepared(splits), data(), "format"))["group leakage"]
    assert f.verdict is WARN and "set data.fields.group" in f.sentence


def test_d8_time_overlap_fails_unless_the_split_is_by_group():
    splits = {
        "train": [ex("t1", "x", time="2024-01-01"), ex("t2", "y", time="2024-03-01")],
        "validation": [ex("v1", "z", time="2024-02-01"), ex("v2", "w", time="2024-04-01")],
        "test": [ex("s1", "u", time="2024-05-01")],
    }
    f = check_time_overlap(splits, "created_at", "random")
    assert f.verdict is FAIL and f.examples == ["v1"]
    assert f.sentence.startswith(
        "1 validation examples are dated no later than the end of an earlier split "
        "(training ends 2024-03-01)"
    )
    assert f.details["periods"] == {
        "train": ["2024-01-01", "2024-03-01"],
        "validation": ["2024-02-01", "2024-04-01"],
        "test": ["2024-05-01", "2024-05-01"],
    }
    assert f.sentence.endswith("use split.policy: time")
    assert check_time_overlap(splits, "created_at", "group").verdict is WARN
    splits["validation"] = [ex("v1", "z", time="2024-03-02T00:00:00")]
    assert check_time_overlap(splits, "created_at", "random").verdict is PASS


def test_d8_time_overlap_warns_on_unreadable_times():
    splits = {
        "train": [ex("t1", "x", time="last tuesday")],
        "test": [ex("s1", "y", time="2024-01-01")],
    }
    f = check_time_overlap(splits, "created_at", "time")
    assert f.verdict is WARN and f.examples == ["t1"] and "ISO 8601" in f.sentence


def test_d6_labels_absent_from_training_fail():
    splits = {
        "train": [ex("t1", "a", "billing"), ex("t2", "b", "delivery")],
        "validation": [ex("v1", "c", "refund")],
        "test": [ex("s1", "d", "billing"), ex("s2", "e", "security")],
    }
    f = by_check(run_audit(prepared(splits, ["billing", "delivery"]), data(), "classification"))[
        "labels absent from training"
    ]
    assert f.verdict is FAIL and f.requirement == "D6, H2"
    assert f.sentence.startswith(
        "2 label(s) occur in evaluation but never in training (refund, security)"
    )
    assert f.examples == ["v1", "s2"]


def test_h2_class_balance_passes_and_warns_on_ratio_and_tiny_classes():
    audit = data().audit
    balanced = {
        "train": [ex(f"a{i}", "x", "a") for i in range(10)]
        + [ex(f"b{i}", "y", "b") for i in range(6)]
    }
    f = check_class_balance(balanced, ["a", "b"], audit)
    assert f.verdict is PASS
    assert f.sentence == "training has 2 classes from 6 (b) to 10 (a) examples, ratio 1.7"
    even = {"train": [ex(f"{c}{i}", f"{c} {i}", c) for c in "ab" for i in range(8)]}
    assert check_class_balance(even, ["a", "b"], audit).sentence == (
        "training has 2 classes of 8 examples each"
    )
    skewed = {
        "train": [ex(f"a{i}", "x", "a") for i in range(90)]
        + [ex(f"b{i}", "y", "b") for i in range(4)]
    }
    f = check_class_balance(skewed, ["a", "b"], audit)
    assert f.verdict is WARN and f.details["ratio"] == 22.5
    assert (
        "above data.audit.imbalance_warn_ratio 20" in f.sentence
        and "1 class(es) under 5 examples (b)" in f.sentence
    )


def test_d6_label_mapping_in_another_order_fails_naming_the_first_id():
    ours = ["account", "billing", "delivery", "refund"]
    theirs = {0: "account", 1: "delivery", 2: "billing", 3: "refund"}
    f = check_label_mapping(theirs, ours)
    assert f.verdict is FAIL and f.requirement == "D6"
    assert f.sentence.startswith(
        "id 1 is `delivery` in the model but `billing` in your data (2 id(s) differ)"
    )
    assert f.examples == ["1", "2"]
    swapped = {"0": "account", "1": "billing", "2": "delivery", "3": "billing"}  # JSON keys
    f = check_label_mapping(swapped, ours)
    assert f.sentence.startswith("id 3 is `billing` in the model but `refund` in your data")


def test_d6_label_mapping_generic_same_and_foreign_heads():
    ours = ["a", "b", "c"]
    assert check_label_mapping({0: "LABEL_0", 1: "LABEL_1"}, ours).verdict is PASS  # default config
    unnamed = check_label_mapping({0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}, ours)
    assert unnamed.verdict is WARN and "3 unnamed outputs" in unnamed.sentence
    assert check_label_mapping({0: "a", 1: "b", 2: "c"}, ours).verdict is PASS
    foreign = check_label_mapping({0: "positive", 1: "negative"}, ours)
    assert foreign.verdict is WARN and "replaced by a new head" in foreign.sentence
    assert check_label_mapping({0: "a", 1: "b"}, ours).verdict is FAIL  # id 2 missing in the model


def test_label_mapping_runs_only_for_classification_with_a_model_map():
    splits = {"train": [ex("t1", "x", "a"), ex("t2", "y", "b")], "test": [ex("s1", "z", "a")]}
    checks = by_check(
        run_audit(
            prepared(splits, ["a", "b"]), data(), "classification", model_label_map={0: "b", 1: "a"}
        )
    )
    assert checks["label mapping"].verdict is FAIL
    assert "label mapping" not in by_check(
        run_audit(prepared(splits, ["a", "b"]), data(), "classification")
    )


# ---- lengths through the real encoders, with a real (tiny, trained here) BPE tokenizer --------


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tunepilot.model.tiny import train_tokenizer

    return train_tokenizer(tmp_path_factory.mktemp("tok"))


def test_s6_extraction_answer_cut_by_max_length_fails_with_the_length_needed(tokenizer):
    from tunepilot.tasks import GenerationEncoder

    encoder = GenerationEncoder(tokenizer, "Extract: {text}\nJSON: ", max_length=40)
    short = ex("ok", "order 1", label=None, target={"id": "1"})
    long = ex(
        "cut", "order " + "very " * 30 + "long", label=None, target={"id": "2", "note": "x" * 40}
    )
    splits = {"train": [short, long], "test": [ex("s", "order 3", label=None, target={"id": "3"})]}
    f = by_check(run_audit(prepared(splits), data(max_length=40), "extraction", encoder=encoder))[
        "length and truncation"
    ]
    needed = encoder.encode(long).full_length
    assert needed > 40
    assert f.verdict is FAIL and f.requirement == "D3, S6" and f.examples == ["cut"]
    assert f"the longest needs {needed}: raise data.max_length to {needed}" in f.sentence
    assert "not the same experiment" in f.sentence
    assert f.details["per_split"]["train"]["max"] == needed


def test_d3_classification_truncation_warns_above_the_share_and_passes_below(tokenizer):
    from tunepilot.tasks import ClassificationEncoder

    encoder = ClassificationEncoder(tokenizer, ["a", "b"], max_length=16)
    rows = [ex(f"t{i}", f"short text {i}", "a" if i % 2 else "b") for i in range(60)]
    long = ex("long", "a much longer message " * 10, "a")
    f = by_check(
        run_audit(
            prepared({"train": [*rows, long]}, ["a", "b"]),
            data(max_length=16),
            "classification",
            encoder=encoder,
        )
    )["length and truncation"]
    assert f.verdict is PASS and f.details["truncated"] == 1 and f.examples == ["long"]  # 1/61 < 2%
    f = by_check(
        run_audit(
            prepared({"train": [*rows[:20], long]}, ["a", "b"]),
            data(max_length=16),
            "classification",
            encoder=encoder,
        )
    )["length and truncation"]
    assert f.verdict is WARN and f.sentence.startswith("1 examples (4.8%) are cut at max_length 16")


def test_d3_examples_the_encoder_refuses_fail_instead_of_crashing(tokenizer):
    from tunepilot.tasks import ClassificationEncoder

    encoder = ClassificationEncoder(tokenizer, ["a"], max_length=16)
    splits = {"train": [ex("t1", "x", "a")], "test": [ex("s1", "y", "zzz")]}
    f = by_check(run_audit(prepared(splits, ["a"]), data(), "classification", encoder=encoder))[
        "length and truncation"
    ]
    assert f.verdict is FAIL and f.examples == ["s1"] and "cannot be encoded" in f.sentence


def test_audit_to_json_round_trips_with_the_overall_verdict(tmp_path: Path):
    splits = {
        "train": [ex("t1", "Where is my card?", group="g1")],
        "test": [ex("s1", "where is my card?", group="g1")],
    }
    findings = run_audit(prepared(splits), data(fields={"group": "g"}), "format")
    out = audit_to_json(findings)
    assert out["verdict"] == "FAIL" and out["counts"]["FAIL"] == 2  # exact copy + group leak
    assert sum(out["counts"].values()) == len(findings) == len(out["findings"])
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(out))
    assert json.loads(path.read_text())["findings"][0]["check"] == "cleaning"
