"""Splits separated by the unit that prevents leakage (D8), deterministic, test sealed (H4)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tunepilot.campaign import Fields, SplitPolicy, validate_mapping
from tunepilot.data.prepare import prepare_data
from tunepilot.data.split import make_splits
from tunepilot.errors import InputError
from tunepilot.tasks.example import Example


def examples(n: int, **kw) -> list[Example]:
    labels = kw.pop("labels", ["a"])
    return [
        Example(id=f"e{i:04d}", text=f"t{i}", source=f"f:{i + 1}", label=labels[i % len(labels)])
        for i in range(n)
    ]


def ids(splits) -> dict[str, list[str]]:
    return {k: [e.id for e in v] for k, v in splits.items()}


FIELDS = Fields(text="text", label="label")


def test_d8_random_split_is_deterministic_from_the_seed() -> None:
    data = examples(200)
    first = make_splits(data, SplitPolicy(policy="random", seed=1), FIELDS)
    again = make_splits(list(reversed(data)), SplitPolicy(policy="random", seed=1), FIELDS)
    other = make_splits(data, SplitPolicy(policy="random", seed=2), FIELDS)
    assert {k: set(v) for k, v in ids(first).items()} == {k: set(v) for k, v in ids(again).items()}
    assert set(ids(first)["test"]) != set(ids(other)["test"])
    assert [len(v) for v in first.values()] == [160, 20, 20]
    assert ids(first)["train"] == sorted(ids(first)["train"])  # file order inside a split


def test_d8_stratified_keeps_class_proportions_and_every_class_in_every_split() -> None:
    data = examples(300, labels=["a"] * 27 + ["b"] * 2 + ["c"])  # 90% a, ~6.7% b, ~3.3% c
    splits = make_splits(data, SplitPolicy(policy="stratified", seed=0), FIELDS)
    total = Counter(e.label for e in data)
    for name, share in (("validation", 0.1), ("test", 0.1)):
        counts = Counter(e.label for e in splits[name])
        assert set(counts) == {"a", "b", "c"}
        for label, n in total.items():
            assert counts[label] == round(n * share)


def test_d8_group_split_never_puts_a_group_in_two_splits() -> None:
    rng = random.Random(3)
    data = [
        Example(id=f"e{i}", text="t", source=f"f:{i}", group=f"conv-{rng.randrange(60)}")
        for i in range(400)
    ]
    splits = make_splits(data, SplitPolicy(policy="group", seed=0), Fields(group="group"))
    groups = {name: {e.group for e in exs} for name, exs in splits.items()}
    assert not groups["train"] & groups["validation"]
    assert not groups["train"] & groups["test"]
    assert not groups["validation"] & groups["test"]
    assert all(len(v) > 20 for v in splits.values())
    assert sum(len(v) for v in splits.values()) == 400


def test_d8_time_split_periods_do_not_overlap_even_with_ties() -> None:
    days = [f"2024-01-{d:02d}" for d in range(1, 11)]
    data = [
        Example(id=f"e{i:03d}", text="t", source=f"f:{i}", time=days[i % 10]) for i in range(100)
    ]
    random.Random(0).shuffle(data)
    splits = make_splits(data, SplitPolicy(policy="time"), Fields(time="time"))
    assert max(e.time for e in splits["train"]) < min(e.time for e in splits["validation"])
    assert max(e.time for e in splits["validation"]) < min(e.time for e in splits["test"])
    # 10 examples per day: the 10% test is exactly the last day, validation the day before
    assert {e.time for e in splits["test"]} == {"2024-01-10"}
    assert {e.time for e in splits["validation"]} == {"2024-01-09"}


def test_d8_time_tie_at_a_boundary_moves_to_the_later_split() -> None:
    times = ["1", "2", "3", "4", "5", "6", "7", "8", "8", "8"]
    data = [Example(id=f"e{i}", text="t", source=f"f:{i}", time=t) for i, t in enumerate(times)]
    splits = make_splits(data, SplitPolicy(policy="time"), Fields(time="time"))
    assert [e.time for e in splits["test"]] == ["8", "8", "8"]
    assert [e.time for e in splits["validation"]] == ["7"]


def test_d8_files_policy_keeps_the_users_files() -> None:
    train = examples(10)
    val = [Example(id=f"v{i}", text="t", source="v:1") for i in range(3)]
    test = [Example(id=f"s{i}", text="t", source="s:1") for i in range(2)]
    splits = make_splits(
        {"train": train, "validation": val, "test": test}, SplitPolicy(policy="files"), FIELDS
    )
    assert ids(splits) == {
        "train": [e.id for e in train],
        "validation": ["v0", "v1", "v2"],
        "test": ["s0", "s1"],
    }


def test_h4_sealed_test_is_kept_when_seed_or_order_changes() -> None:
    data = examples(100, labels=["a", "b"])
    sealed = ids(make_splits(data, SplitPolicy(seed=0), FIELDS))["test"]
    for seed, order in ((0, list(reversed(data))), (7, data), (9, random.sample(data, 100))):
        splits = make_splits(order, SplitPolicy(seed=seed), FIELDS, sealed_test_ids=sealed)
        assert sorted(ids(splits)["test"]) == sorted(sealed)
        assert not set(ids(splits)["train"]) & set(sealed)
        assert not set(ids(splits)["validation"]) & set(sealed)


def test_h4_seal_with_unchanged_data_gives_the_unsealed_split() -> None:
    data = examples(100, labels=["a", "b", "c"])
    plain = make_splits(data, SplitPolicy(seed=4), FIELDS)
    sealed = make_splits(data, SplitPolicy(seed=4), FIELDS, sealed_test_ids=ids(plain)["test"])
    assert ids(sealed) == ids(plain)


def test_h4_sealed_id_missing_from_the_data_is_refused() -> None:
    data = examples(50)
    sealed = ids(make_splits(data, SplitPolicy(), FIELDS))["test"]
    gone = [e for e in data if e.id != sealed[0]]
    with pytest.raises(InputError) as info:
        make_splits(gone, SplitPolicy(), FIELDS, sealed_test_ids=sealed)
    text = str(info.value)
    assert "data/test_seal.json" in text and sealed[0] in text
    assert "new campaign" in text and "delete data/test_seal.json deliberately" in text


def _campaign(seed: int) -> Any:
    return validate_mapping(
        {
            "name": "c",
            "hypothesis": {"behaviour": "b", "task": "classification"},
            "model": {"name_or_path": "m"},
            "data": {
                "file": "d.jsonl",
                "fields": {"id": "id", "text": "text", "label": "label"},
                "split": {"policy": "stratified", "seed": seed},
            },
        }
    )


def test_h4_prepare_writes_the_seal_once_and_keeps_it(tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "text": f"text {i}", "label": "ab"[i % 2]} for i in range(60)]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", "utf-8")
    first = prepare_data(_campaign(seed=0), tmp_path)
    seal = json.loads((tmp_path / "data" / "test_seal.json").read_text("utf-8"))
    assert sorted(seal["ids"]) == sorted(e.id for e in first.splits["test"])
    written = json.loads((first.folder / "splits.json").read_text("utf-8"))
    assert written["version"] == first.version
    assert written["ids"]["test"] == [e.id for e in first.splits["test"]]
    assert written["counts"] == {"train": 48, "validation": 6, "test": 6}

    second = prepare_data(_campaign(seed=0), tmp_path)
    assert second.version == first.version  # the seal existing changes nothing

    (tmp_path / "d.jsonl").write_text(
        "\n".join(json.dumps(r) for r in reversed(rows)) + "\n", "utf-8"
    )
    reseeded = prepare_data(_campaign(seed=5), tmp_path)
    assert sorted(e.id for e in reseeded.splits["test"]) == sorted(seal["ids"])
    assert json.loads((tmp_path / "data" / "test_seal.json").read_text("utf-8")) == seal


def test_h4_new_rows_in_a_sealed_group_are_refused() -> None:
    data = [Example(id=f"e{i}", text="t", source=f"f:{i}", group=f"g{i // 4}") for i in range(80)]
    policy = SplitPolicy(policy="group")
    sealed = ids(make_splits(data, policy, Fields(group="g")))["test"]
    group = next(e.group for e in data if e.id == sealed[0])
    grown = [*data, Example(id="new", text="t", source="f:99", group=group)]
    with pytest.raises(InputError, match="share a group with the sealed test"):
        make_splits(grown, policy, Fields(group="g"), sealed_test_ids=sealed)


def test_h4_new_rows_inside_the_sealed_time_period_are_refused() -> None:
    data = [Example(id=f"e{i}", text="t", source=f"f:{i}", time=str(i)) for i in range(30)]
    policy, fields = SplitPolicy(policy="time"), Fields(time="time")
    sealed = ids(make_splits(data, policy, fields))["test"]
    assert sorted(sealed) == ["e27", "e28", "e29"]
    assert ids(make_splits(data, policy, fields, sealed_test_ids=sealed))["test"] == sealed
    later = [*data, Example(id="late", text="t", source="f:99", time="40")]
    with pytest.raises(InputError, match="not earlier than the sealed test period"):
        make_splits(later, policy, fields, sealed_test_ids=sealed)


def test_h4_files_policy_seal_must_match_the_test_file() -> None:
    train = examples(10)
    test = [Example(id=f"s{i}", text="t", source="s:1") for i in range(3)]
    policy = SplitPolicy(policy="files")
    kept = make_splits(
        {"train": train, "test": test}, policy, FIELDS, sealed_test_ids=["s0", "s1", "s2"]
    )
    assert ids(kept)["test"] == ["s0", "s1", "s2"]
    with pytest.raises(InputError, match="differ between the test file and the seal"):
        make_splits({"train": train, "test": test}, policy, FIELDS, sealed_test_ids=["s0", "s1"])
