"""Bad data is refused with InputError naming file:line (or the key) and the fix (D1, D8, H4).

Each case runs the whole `prepare_data` path on files written to tmp_path, so what is tested is
what a user sees from `tunepilot data audit`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from campaign_support import files_campaign
from tunepilot.campaign import validate_mapping
from tunepilot.data.prepare import prepare_data, seal_hash
from tunepilot.errors import InputError


def rows(*items: dict[str, Any], n_good: int = 6) -> str:
    good = [{"id": f"g{i}", "text": f"fine {i}", "label": "ab"[i % 2]} for i in range(n_good)]
    return "".join(json.dumps(r) + "\n" for r in [*good, *items])


GOOD = rows()  # lines 1-6 are valid; a bad row appended is line 7


@dataclass
class Case:
    files: dict[str, str | bytes]
    where: str  # the problem's location must contain this
    found: str  # ... what was found must contain this
    fix: str  # ... and the fix this
    data: dict[str, Any] = field(default_factory=dict)
    task: str = "classification"


CASES = {
    "malformed_json_line": Case(
        {"d.jsonl": GOOD + '{"id": "x", "text": "x", "label": }\n'},
        "d.jsonl:7",
        "not valid JSON (Expecting value at column",
        "one JSON object per line",
    ),
    "json_line_not_an_object": Case(
        {"d.jsonl": GOOD + "[1, 2]\n"}, "d.jsonl:7", "a JSON list", "as an object"
    ),
    "json_array_file": Case(
        {"d.json": '[{"text": "x", "label": "a"}]\n'},
        "d.json:1",
        "JSON array",
        "JSONL",
        data={"file": "d.json"},
    ),
    "missing_field": Case(
        {"d.jsonl": rows({"id": "x", "text": "no label"})},
        "d.jsonl:7",
        "missing `label`",
        "fill `label`",
    ),
    "non_utf8_bytes": Case(
        {"d.jsonl": GOOD.encode() + b'{"id": "x", "text": "caf\xe9", "label": "a"}\n'},
        "d.jsonl:7",
        f"byte 0xe9 at byte offset {len(GOOD.encode()) + 24} (column 25",
        "as UTF-8",
    ),
    "unknown_label": Case(
        {"d.jsonl": rows({"id": "x", "text": "t", "label": "bb"})},
        "d.jsonl:7",
        "label `bb` (lines 7)",
        "did you mean `b`?",
        data={"labels": ["a", "b"]},
    ),
    "empty_text": Case(
        {"d.jsonl": rows({"id": "x", "text": "   ", "label": "a"})},
        "d.jsonl:7",
        "empty text",
        "add `drop_empty`",
        data={"cleaning": ["strip"]},
    ),
    "duplicate_ids": Case(
        {"d.jsonl": rows({"id": "g2", "text": "t", "label": "a"})},
        "d.jsonl:7",
        "id `g2` already used on line 3",
        "unique",
    ),
    "wrong_field_name": Case(
        {"d.jsonl": GOOD},
        "d.jsonl:1 data.fields.label",
        "column `lable` is in no row",
        "did you mean `label`?",
        data={"fields": {"id": "id", "text": "text", "label": "lable"}},
    ),
    "label_is_a_list": Case(
        {"d.jsonl": rows({"id": "x", "text": "t", "label": ["a"]})},
        "d.jsonl:7",
        "`label` holds a list",
        "one value",
    ),
    "empty_file": Case({"d.jsonl": ""}, "d.jsonl:1", "the file is empty", "examples in it"),
    "missing_file": Case(
        {},
        "nope.jsonl",
        "no such file",
        "relative paths start at the campaign folder",
        data={"file": "nope.jsonl"},
    ),
    "format_unknown": Case(
        {"d.dat": "hello\n"},
        "d.dat",
        "cannot tell the format",
        "data.format",
        data={"file": "d.dat"},
    ),
    "csv_column_count": Case(
        {"d.csv": "text,label\nok,a\nhello, world,b\nfine,b\n"},
        "d.csv:3",
        "3 fields where the header has 2",
        "quote fields that contain the separator",
        data={"file": "d.csv", "fields": {"text": "text", "label": "label"}},
    ),
    "csv_stray_quote": Case(
        {"d.csv": 'text,label\nok,a\n"quoted" then text,b\n'},
        "d.csv:3",
        "unreadable CSV record",
        "data.quoting: false",
        data={"file": "d.csv", "fields": {"text": "text", "label": "label"}},
    ),
    "headerless_without_columns": Case(
        {"d.tsv": "a\tx\n"},
        "data.columns",
        "no column names",
        "columns: [label, text]",
        data={"file": "d.tsv", "header": False},
    ),
    "bad_target_json": Case(
        {"d.csv": 'text,answer\nbook it,"{""people"": "\n'},
        "d.csv:2",
        "target `answer` is not valid JSON",
        "JSON object",
        task="extraction",
        data={"file": "d.csv", "fields": {"text": "text", "target": "answer"}},
    ),
    "target_not_an_object": Case(
        {"d.jsonl": '{"text": "x", "answer": 3}\n'},
        "d.jsonl:1",
        "a JSON int",
        "JSON object",
        task="extraction",
        data={"fields": {"text": "text", "target": "answer"}},
    ),
    "bad_parquet": Case(
        {"d.parquet": b"PAR1 this is not parquet"},
        "d.parquet",
        "not a readable Parquet file",
        "re-export",
        data={"file": "d.parquet"},
    ),
    "unsortable_time": Case(
        {
            "d.jsonl": "".join(
                json.dumps({"text": f"t{i}", "label": "a", "when": w}) + "\n"
                for i, w in enumerate(["2024-01-01", "yesterday", "2024-01-03"])
            )
        },
        "d.jsonl:2",
        "time `yesterday` in `when` is neither",
        "ISO 8601",
        data={
            "fields": {"text": "text", "label": "label", "time": "when"},
            "split": {"policy": "time"},
        },
    ),
    "group_missing_for_group_policy": Case(
        {"d.jsonl": GOOD.replace('"id": "g3"', '"conv": "c1", "id": "g3"')},
        "d.jsonl:1",
        "missing `conv`",
        "fill `conv`",
        data={
            "fields": {"text": "text", "label": "label", "group": "conv"},
            "split": {"policy": "group"},
        },
    ),
    "duplicate_ids_across_files": Case(
        {"train.jsonl": GOOD, "test.jsonl": rows(n_good=1)},
        "test.jsonl:1",
        "id `g0` is also used at",
        "unique across",
        data={"file": None, "files": {"train": "train.jsonl", "test": "test.jsonl"}},
    ),
    "sealed_id_missing": Case(
        {
            "d.jsonl": GOOD,
            "data/test_seal.json": json.dumps(
                {"ids": ["gone"], "hash": seal_hash(["gone"]), "created_at": "2026-01-01"}
            ),
        },
        "data/test_seal.json",
        "sealed test no longer matches",
        "new campaign",
    ),
    "seal_edited_by_hand": Case(
        {
            "d.jsonl": GOOD,
            "data/test_seal.json": json.dumps(
                {"ids": ["g1"], "hash": "0000", "created_at": "2026-01-01"}
            ),
        },
        "test_seal.json hash",
        "do not match the seal's hash",
        "delete it deliberately",
    ),
    "nothing_left_after_cleaning": Case(
        {"d.jsonl": '{"id": "x", "text": " ", "label": "a"}\n'},
        "data.cleaning",
        "no example is left after cleaning",
        "data.fields.text",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_d1_bad_data_is_refused_with_location_and_fix(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    for rel, content in case.files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    data = {"file": "d.jsonl", "fields": {"id": "id", "text": "text", "label": "label"}}
    data |= case.data
    if data.get("file") is None:
        data.pop("file")
    if case.task != "classification" and "label" in data["fields"]:
        data["fields"] = {k: v for k, v in data["fields"].items() if k != "label"}
    campaign = validate_mapping(
        {
            "name": "c",
            "hypothesis": {"behaviour": "b", "task": case.task},
            "model": {"name_or_path": "m"},
            "data": data,
        }
    )
    with pytest.raises(InputError) as info:
        prepare_data(campaign, tmp_path, write=False)
    matching = [p for p in info.value.problems if case.where in p.where and case.found in p.found]
    assert matching, str(info.value)
    problem = matching[0]
    assert case.fix in problem.fix, str(problem)
    assert case.where in str(problem) and "Fix: " in str(problem)
    assert not (tmp_path / "data" / "splits.json").exists()


def test_d1_problems_from_every_file_are_reported_together(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text(GOOD + "{oops\n", "utf-8")
    (tmp_path / "validation.jsonl").write_text('{"text": "", "label": "a"}\n', "utf-8")
    files = {"train": "train.jsonl", "validation": "validation.jsonl", "test": "missing.jsonl"}
    campaign = validate_mapping(files_campaign(files, cleaning=[]))
    with pytest.raises(InputError) as info:
        prepare_data(campaign, tmp_path, write=False)
    wheres = [p.where for p in info.value.problems]
    assert [w.rsplit("/", 1)[-1] for w in wheres] == [
        "train.jsonl:7",
        "validation.jsonl:1",
        "missing.jsonl",
    ]
