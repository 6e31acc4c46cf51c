"""Loading every supported format into Examples with stable ids and file:line sources (D1)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tunepilot.campaign import DataSettings
from tunepilot.data.load import load_file
from tunepilot.errors import MAX_PROBLEMS, InputError


def settings(**kw) -> DataSettings:
    kw.setdefault("file", "unused")
    kw.setdefault("fields", {"text": "text", "label": "label"})
    return DataSettings(**kw)


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_d1_jsonl_loads_with_line_sources_and_stable_ids(tmp_path: Path) -> None:
    f = write(
        tmp_path / "train.jsonl",
        '{"text": "hello", "label": "a"}\n\n{"text": "bye", "label": 2}\n',
    )
    examples = load_file(f, settings(), "classification")
    assert [e.id for e in examples] == ["train:1", "train:3"]  # blank line 2 is skipped
    assert [e.source for e in examples] == [f"{f}:1", f"{f}:3"]
    assert examples[1].label == "2"  # labels compare as strings, 2 and "2" are one class
    assert load_file(f, settings(), "classification") == examples


def test_d1_id_column_is_used_when_mapped(tmp_path: Path) -> None:
    f = write(tmp_path / "d.jsonl", '{"uid": 7, "text": "x", "label": "a"}\n')
    data = settings(fields={"id": "uid", "text": "text", "label": "label"})
    assert load_file(f, data, "classification")[0].id == "7"


def test_d1_csv_with_embedded_newline_reports_record_start_line(tmp_path: Path) -> None:
    f = write(tmp_path / "d.csv", 'text,label\n"two\nlines",a\nthird,b\n')
    examples = load_file(f, settings(), "classification")
    assert [e.text for e in examples] == ["two\nlines", "third"]
    assert [e.source.rsplit(":", 1)[1] for e in examples] == ["2", "4"]


def test_d1_crlf_and_bom_keep_physical_line_numbers(tmp_path: Path) -> None:
    f = write(tmp_path / "d.csv", b"\xef\xbb\xbftext,label\r\nx,a\r\ny,b\r\n")
    examples = load_file(f, settings(), "classification")
    assert [(e.text, e.label, e.source[-1]) for e in examples] == [("x", "a", "2"), ("y", "b", "3")]


def test_d1_tsv_without_header_uses_declared_columns(tmp_path: Path) -> None:
    f = write(tmp_path / "d.tsv", 'spam\t"Free" entry now\nham\tok\n')
    data = settings(header=False, columns=["label", "text"], quoting=False)
    examples = load_file(f, data, "classification")
    assert [(e.label, e.text) for e in examples] == [("spam", '"Free" entry now'), ("ham", "ok")]


def test_d1_txt_or_no_suffix_with_tabs_is_read_as_tsv(tmp_path: Path) -> None:
    data = settings(header=False, columns=["label", "text"], quoting=False)
    for name in ("data.txt", "DATA"):
        f = write(tmp_path / name, "a\tone, with comma\nb\ttwo\n")
        assert [e.text for e in load_file(f, data, "classification")] == ["one, with comma", "two"]


def test_d1_csv_target_json_string_is_parsed_for_extraction(tmp_path: Path) -> None:
    f = write(tmp_path / "d.csv", 'text,answer\nbook 2,"{""people"": [""2""]}"\n')
    data = settings(fields={"text": "text", "target": "answer"})
    assert load_file(f, data, "extraction")[0].target == {"people": ["2"]}


def test_d1_jsonl_target_object_and_context_columns(tmp_path: Path) -> None:
    row = {"text": "5", "slots": {"people": ["5"]}, "requested": ["people"]}
    f = write(tmp_path / "d.jsonl", json.dumps(row) + "\n")
    data = settings(fields={"text": "text", "target": "slots", "context": ["requested"]})
    ex = load_file(f, data, "extraction")[0]
    assert ex.target == {"people": ["5"]} and ex.context == {"requested": ["people"]}


def test_d1_parquet_rows_are_numbered_from_one(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    f = tmp_path / "d.parquet"
    table = pa.table(
        {"text": ["a", "b"], "label": ["x", "y"], "when": ["2024-01-01", "2024-02-01"]}
    )
    pq.write_table(table, f)
    data = settings(fields={"text": "text", "label": "label", "time": "when"})
    examples = load_file(f, data, "classification")
    assert [(e.id, e.source, e.time) for e in examples] == [
        ("d:1", f"{f}:1", "2024-01-01"),
        ("d:2", f"{f}:2", "2024-02-01"),
    ]


def test_d1_all_problems_are_collected_then_counted(tmp_path: Path) -> None:
    f = write(tmp_path / "d.jsonl", "{bad\n" * (MAX_PROBLEMS + 10))
    with pytest.raises(InputError) as info:
        load_file(f, settings(), "classification")
    problems = info.value.problems
    assert len(problems) == MAX_PROBLEMS + 1
    assert problems[-1].found == "and 10 more problem(s)"
    assert problems[1].where == f"{f}:2"


def test_d1_import_of_data_modules_does_not_import_torch() -> None:
    code = (
        "import sys, tunepilot.data.prepare, tunepilot.data.load, tunepilot.data.split;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.realdata
def test_d1_sms_spam_needs_quoting_off(shared_data: Path) -> None:
    """The raw SMS TSV has quote characters inside texts: with quoting off every line is one
    example; with CSV quoting lines would merge silently, so the loader refuses and names the
    setting that fixes it."""
    path = shared_data / "sms_spam" / "SMSSpamCollection"
    raw = settings(header=False, columns=["label", "text"], quoting=False)
    examples = load_file(path, raw, "classification")
    assert len(examples) == 5574
    assert Counter(e.label for e in examples) == {"ham": 4827, "spam": 747}
    assert examples[-1].source == f"{path}:5574"

    # What a default CSV reader does with this file: 2 rows fewer, merged without a word.
    with path.open(encoding="utf-8", newline="") as handle:
        assert len(list(csv.reader(handle, delimiter="\t"))) == 5572

    quoted = settings(header=False, columns=["label", "text"], quoting=True)
    with pytest.raises(InputError) as info:
        load_file(path, quoted, "classification")
    assert info.value.problems[0].where == f"{path}:283"
    assert "data.quoting: false" in str(info.value)
