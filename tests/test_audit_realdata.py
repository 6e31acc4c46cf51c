"""The audit on real public data (D2, D8): the duplicates and leaks documented in
../shared/data/SOURCES.md are found, with their counts. Skipped when the folder is absent."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tunepilot.campaign import DataSettings, validate_mapping
from tunepilot.data.audit.run import run_audit
from tunepilot.data.load import load_file
from tunepilot.data.normalize import normalize_text
from tunepilot.data.prepare import prepare_data
from tunepilot.data.prepared import PreparedData
from tunepilot.verdict import Verdict

pytestmark = pytest.mark.realdata
PASS, WARN, FAIL = Verdict.PASS, Verdict.WARN, Verdict.FAIL


def by_check(findings):
    return {f.check: f for f in findings}


def campaign(data: dict, task: str = "classification"):
    return validate_mapping(
        {
            "name": "real",
            "hypothesis": {"behaviour": "audit real data", "task": task},
            "model": {"name_or_path": "unused-here"},
            "data": data,
        }
    )


def audit(data: dict, root: Path, task: str = "classification"):
    c = campaign(data, task)
    prepared = prepare_data(c, root, write=False)
    return prepared, by_check(run_audit(prepared, c.data, task))


def test_d2_banking77_test_file_repeats_seven_training_rows_after_normalisation(shared_data):
    """train.csv vs test.csv exactly as given: no byte-identical repeat, but 6 test rows equal
    a training row once leading/trailing whitespace is stripped (SOURCES.md), and a 7th once
    the double space inside "UK.  Can I still get a card?" is collapsed too; all 7 are found,
    plus near copies (punctuation, one word) that no exact search sees."""
    folder = shared_data / "banking77"
    data = DataSettings.model_validate(
        {
            "files": {"train": str(folder / "train.csv"), "test": str(folder / "test.csv")},
            "fields": {"text": "text", "label": "category"},
            "cleaning": [],
        }
    )
    splits = {
        "train": load_file(folder / "train.csv", data, "classification", "train"),
        "validation": [],
        "test": load_file(folder / "test.csv", data, "classification", "test"),
    }
    assert (len(splits["train"]), len(splits["test"])) == (10_003, 3_080)
    names = sorted({ex.label for ex in splits["train"]})
    prepared = PreparedData(splits, "v", names, [], {"policy": "files"})
    found = by_check(run_audit(prepared, data, "classification"))

    def read(name: str) -> list[str]:
        with open(folder / name, newline="", encoding="utf-8") as handle:
            return [row["text"] for row in csv.DictReader(handle)]

    train_raw, test_raw = read("train.csv"), read("test.csv")
    assert not set(test_raw) & set(train_raw)  # byte for byte: nothing to see
    stripped = {t.strip() for t in train_raw}
    by_strip = [t for t in test_raw if t.strip() in stripped]
    assert len(by_strip) == 6  # the SOURCES.md count

    exact = found["exact duplicates across splits"]
    assert exact.verdict is FAIL and exact.details["counts"] == {"test": 7}
    text_of = {ex.id: ex.text for ex in splits["test"]}
    flagged = [text_of[a] for a, _ in exact.details["pairs"]]
    assert sorted(by_strip) == sorted(t for t in flagged if t.strip() in stripped)
    assert [t for t in flagged if t.strip() not in stripped] == [
        "I don't live in the UK.  Can I still get a card?"
    ]
    assert exact.sentence.startswith("7 test examples equal a training example after normalisation")

    near = found["near duplicates across splits"]
    assert near.verdict is WARN and near.details["pairs"] > 0
    print(
        f"banking77: {near.details['pairs']} near-duplicate pairs across train/test, "
        f"{near.details['examples_per_split']['test']} test examples involved"
    )
    assert found["labels absent from training"].verdict is PASS


SMS = {
    "format": "tsv",
    "quoting": False,
    "header": False,
    "columns": ["label", "text"],
    "fields": {"text": "text", "label": "label"},
    "split": {"policy": "random", "seed": 0},
}


def test_d2_sms_spam_random_split_reports_cross_split_copies_until_deduplicated(
    shared_data, tmp_path
):
    data = {**SMS, "file": str(shared_data / "sms_spam" / "SMSSpamCollection")}
    prepared, found = audit(data, tmp_path)
    # an independent count: evaluation rows whose normalised text is in an earlier split
    seen: set[str] = set()
    expected = {}
    for split in ("train", "validation", "test"):
        texts = [normalize_text(ex.text) for ex in prepared.splits[split]]
        if split != "train":
            expected[split] = sum(t in seen for t in texts)
        seen.update(texts)
    exact = found["exact duplicates across splits"]
    assert exact.verdict is FAIL and exact.details["counts"] == expected
    assert sum(expected.values()) > 50
    print(f"sms_spam random split: cross-split exact duplicates {expected}")

    deduped, found = audit({**data, "cleaning": ["strip", "drop_exact_duplicates"]}, tmp_path)
    assert found["exact duplicates across splits"].verdict is PASS
    assert found["exact duplicates within splits"].verdict is PASS
    dropped = [c for c in deduped.cleaning if c.rule == "drop_exact_duplicates"][0].dropped
    assert dropped == 415  # SOURCES.md: 415 extra rows after strip + lowercase + collapse


def test_d8_sgd_user_turns_leak_dialogues_under_a_random_split_not_a_group_split(
    shared_data, tmp_path
):
    data = {
        "file": str(shared_data / "sgd_user_turns" / "train.jsonl"),
        "fields": {"text": "text", "target": "target", "group": "group_id"},
    }
    _, found = audit({**data, "split": {"policy": "random"}}, tmp_path, task="extraction")
    leak = found["group leakage"]
    assert leak.verdict is FAIL and "split by group_id" in leak.sentence
    assert leak.details["examples_per_split"]["validation"] > 1000  # 1,788 dialogues, 13,686 turns

    prepared, found = audit({**data, "split": {"policy": "group"}}, tmp_path, task="extraction")
    assert found["group leakage"].verdict is PASS
    assert found["group leakage"].details["groups"] == 1788
    # generic acknowledgements ("Thank you.") still repeat across dialogues (SOURCES.md)
    assert found["exact duplicates across splits"].verdict is FAIL
    assert sum(len(v) for v in prepared.splits.values()) == 13_686
