"""Declared cleaning rules, applied in order and counted (D1), dedup before splitting (D2)."""

from __future__ import annotations

from pathlib import Path

from campaign_support import files_campaign
from tunepilot.campaign import validate_mapping
from tunepilot.data.clean import clean, duplicate_key
from tunepilot.data.prepare import prepare_data
from tunepilot.tasks.example import Example


def ex(i: int, text: str, label: str | None = "a", **kw) -> Example:
    return Example(id=f"e{i}", text=text, source=f"f:{i}", label=label, **kw)


def test_d1_each_rule_counts_what_it_changed_and_dropped() -> None:
    examples = [
        ex(1, "  Hello   World "),
        ex(2, "hello world"),
        ex(3, "   "),
        ex(4, "Cafe\u0301 ok"),  # decomposed é: NFC changes it
        ex(5, "fine"),
    ]
    rules = ["nfc", "strip", "collapse_whitespace", "drop_empty", "drop_exact_duplicates"]
    kept, counts = clean(examples, rules)
    assert [e.id for e in kept] == ["e1", "e4", "e5"]
    table = {c.rule: (c.changed, c.dropped, c.example_ids) for c in counts}
    assert table == {
        "nfc": (1, 0, ["e4"]),
        "strip": (2, 0, ["e1", "e3"]),
        "collapse_whitespace": (1, 0, ["e1"]),
        "drop_empty": (0, 1, ["e3"]),
        "drop_exact_duplicates": (0, 1, ["e2"]),  # "hello world" = "Hello World" normalised
    }
    assert kept[0].text == "Hello World" and kept[1].text == "Caf\u00e9 ok"


def test_d1_rules_apply_in_declared_order() -> None:
    examples = [ex(1, "  x  ")]
    _, counts = clean(examples, ["strip", "drop_empty"])
    assert counts[1].dropped == 0
    kept, counts = clean([ex(1, "   ")], ["drop_empty", "strip"])
    assert counts[0].dropped == 1 and kept == []


def test_d1_max_chars_truncates_text_only_and_counts_it() -> None:
    examples = [ex(1, "abcdef", context={"note": "longer context"}), ex(2, "abc")]
    kept, counts = clean(examples, [{"max_chars": 4}])
    assert [e.text for e in kept] == ["abcd", "abc"]
    assert kept[0].context == {"note": "longer context"}
    assert (counts[0].rule, counts[0].changed, counts[0].example_ids) == ("max_chars=4", 1, ["e1"])


def test_d1_cleaning_touches_text_and_context_never_labels_or_targets() -> None:
    e = ex(1, "  HeLLo ", label=" Mixed Case ", target={"k": "  V  "}, context={"c": " ABC "})
    kept, _ = clean([e], ["strip", "lowercase"])
    assert kept[0].text == "hello" and kept[0].context == {"c": "abc"}
    assert kept[0].label == " Mixed Case " and kept[0].target == {"k": "  V  "}


def test_d2_duplicate_key_includes_context() -> None:
    """Restaurant-8k: "5" means people or time depending on the requested slot."""
    a = ex(1, "5", context={"requested_slots": ["people"]})
    b = ex(2, "5", context={"requested_slots": ["time"]})
    assert duplicate_key(a) != duplicate_key(b)
    kept, counts = clean(
        [a, b, ex(3, " 5 ", context={"requested_slots": ["time"]})], ["drop_exact_duplicates"]
    )
    assert [e.id for e in kept] == ["e1", "e2"] and counts[0].example_ids == ["e3"]


def test_d2_dedup_runs_before_splitting_and_the_training_copy_wins(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text(
        '{"text": "same text", "label": "a"}\n{"text": "other", "label": "b"}\n', "utf-8"
    )
    (tmp_path / "test.jsonl").write_text(
        '{"text": "Same  TEXT", "label": "a"}\n{"text": "new", "label": "b"}\n', "utf-8"
    )
    (tmp_path / "validation.jsonl").write_text('{"text": "val", "label": "a"}\n', "utf-8")
    # test listed first on purpose: the order is train, validation, test anyway
    files = {"test": "test.jsonl", "train": "train.jsonl", "validation": "validation.jsonl"}
    campaign = validate_mapping(files_campaign(files, ["strip", "drop_exact_duplicates"]))
    prepared = prepare_data(campaign, tmp_path, write=False)
    assert [e.id for e in prepared.splits["train"]] == ["train:1", "train:2"]
    assert [e.id for e in prepared.splits["test"]] == ["test:2"]
    dedup = prepared.cleaning[-1]
    assert (dedup.rule, dedup.dropped, dedup.example_ids) == (
        "drop_exact_duplicates",
        1,
        ["test:1"],
    )
