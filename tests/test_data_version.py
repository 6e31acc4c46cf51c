"""The data version (D1): changes with anything the model sees, stable otherwise."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from tunepilot.campaign import SplitPolicy, validate_mapping
from tunepilot.data.prepare import prepare_data
from tunepilot.data.version import data_version, examples_hash
from tunepilot.tasks.example import Example

ENCODING = {
    "model": "m",
    "revision": "abc",
    "max_length": 128,
    "template": None,
    "mask_prompt": True,
    "task": "classification",
}
RULES = ["nfc", "strip"]


def splits() -> dict[str, list[Example]]:
    make = lambda i: Example(id=f"e{i}", text=f"text {i}", source=f"a.jsonl:{i}", label="x")  # noqa: E731
    return {"train": [make(i) for i in range(5)], "validation": [make(5)], "test": [make(6)]}


def version(**changes: Any) -> str:
    args = {
        "examples_by_split": splits(),
        "cleaning_rules": RULES,
        "split_policy": SplitPolicy(),
        "encoding": ENCODING,
    } | changes
    return data_version(**args)


def test_d1_version_is_stable_and_two_hex_parts() -> None:
    v = version()
    examples, dash, encoding = v.partition("-")
    assert v == version() and dash and len(examples) == 16 and len(encoding) == 8
    assert int(examples, 16) >= 0 and int(encoding, 16) >= 0
    # where a file lives is not content: a moved file keeps its version
    moved = {k: [replace(e, source="b/" + e.source) for e in v_] for k, v_ in splits().items()}
    assert version(examples_by_split=moved) == v
    # key order of the encoding identity does not matter (canonical JSON)
    assert version(encoding=dict(reversed(list(ENCODING.items())))) == v


def test_d1_version_changes_with_a_rule_max_length_an_example_or_the_policy() -> None:
    base = version()
    one_changed = splits()
    one_changed["train"][2] = replace(one_changed["train"][2], text="text 2 edited")
    moved_split = splits()
    moved_split["validation"].append(moved_split["train"].pop())
    variants = {
        "rule": version(cleaning_rules=[*RULES, "lowercase"]),
        "max_chars": version(cleaning_rules=[*RULES, {"max_chars": 100}]),
        "max_length": version(encoding=ENCODING | {"max_length": 256}),
        "revision": version(encoding=ENCODING | {"revision": "def"}),
        "example": version(examples_by_split=one_changed),
        "split membership": version(examples_by_split=moved_split),
        "seed": version(split_policy=SplitPolicy(seed=1)),
    }
    assert all(v != base for v in variants.values()), variants
    assert len(set(variants.values())) == len(variants)


def test_d1_examples_hash_follows_content_and_order() -> None:
    train = splits()["train"]
    assert examples_hash(train) == examples_hash(list(train))
    assert examples_hash(train) != examples_hash(train[::-1])
    assert examples_hash(train) != examples_hash([replace(train[0], label="y"), *train[1:]])


def _prepare(tmp_path: Path, **data: Any) -> Any:
    raw = {
        "name": "c",
        "hypothesis": {"behaviour": "b", "task": "classification"},
        "model": {"name_or_path": "m"},
        "data": {"file": "d.jsonl", "fields": {"text": "text", "label": "label"}} | data,
    }
    return prepare_data(validate_mapping(raw), tmp_path, write=False)


def test_d1_prepared_version_follows_campaign_settings(tmp_path: Path) -> None:
    rows = [{"text": f"Text {i}", "label": "ab"[i % 2]} for i in range(40)]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", "utf-8")
    base = _prepare(tmp_path).version
    assert _prepare(tmp_path).version == base
    assert _prepare(tmp_path, max_length=64).version != base
    assert _prepare(tmp_path, cleaning=["strip", "lowercase"]).version != base
    assert _prepare(tmp_path, labels=["b", "a"]).version != base  # label ids change (D6)
    rows[3]["text"] = "Text three"
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", "utf-8")
    assert _prepare(tmp_path).version != base


def test_d1_splits_json_is_written_once_with_sources_relative_to_the_campaign_folder(
    tmp_path: Path,
) -> None:
    """It stored the data file's absolute path and was rewritten by every command, bad-input
    ones included; a data version's record is now written once, relative to the folder."""
    import json

    from tunepilot.campaign import validate_mapping
    from tunepilot.data.prepare import prepare_data

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.jsonl").write_text("".join(
        json.dumps({"id": f"e{i}", "text": f"ticket {i}", "label": "ab"[i % 2]}) + "\n"
        for i in range(20)), encoding="utf-8")  # fmt: skip
    campaign = validate_mapping({
        "name": "t", "hypothesis": {"behaviour": "route", "task": "classification"},
        "model": {"name_or_path": "minilm"},
        "data": {"file": "data/t.jsonl", "fields": {"label": "label"}}})  # fmt: skip
    first = prepare_data(campaign, tmp_path, seal=False)
    path = first.folder / "splits.json"
    recorded = json.loads(path.read_text(encoding="utf-8"))
    assert recorded["sources"] == {"all": {"source": "data/t.jsonl"}}
    before = path.stat()
    again = prepare_data(campaign, tmp_path, seal=False)
    assert again.version == first.version
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
