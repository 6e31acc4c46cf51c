"""Load one data file into `Example`s, or refuse with every problem named by file and line (D1).

Why so strict: a half-loaded file trains a different experiment than the one the campaign
describes, silently. So a file is either loaded completely or an `InputError` lists what is
wrong (up to errors.MAX_PROBLEMS, then a count), each with `file:line`, what was found and the fix.

Formats: JSONL, CSV, TSV (quoting on or off) and Parquet. Bytes are decoded line by line so a
non-UTF-8 byte is reported with its line and byte offset instead of one opaque decode error.
CSV is read with `strict=True`: a quote that is text, not CSV quoting (raw TSV such as the SMS
spam collection), would otherwise merge lines silently; with strict parsing it becomes an
error whose fix is `data.quoting: false`. Pure Python; pyarrow is imported only for Parquet.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from datetime import date, datetime
from datetime import time as dtime
from decimal import Decimal
from pathlib import Path
from typing import Any

from tunepilot.campaign import DataSettings
from tunepilot.data.chat_rows import input_text, last_answer, read_conversation
from tunepilot.data.readers import (
    FLATTEN_IT,
    NESTED_TOO_DEEP,
    Row,
    _decode_lines,
    _read_delimited,
    _read_jsonl,
    _read_parquet,
    detect_format,
    header_looks_like_data,
)
from tunepilot.data.saved_dataset import read_saved_dataset, saved_dataset
from tunepilot.errors import ProblemList
from tunepilot.tasks.example import Example


def load_dataset_source(
    spec: Any, root: Path, data: DataSettings, task: str, record: dict[str, Any] | None = None
) -> list[Example]:
    """Every example of `data.dataset` (hub_dataset.py), like a file's: numbered rows, the
    same field mapping, every problem at once; `record` gets its label and fingerprint."""
    from tunepilot.data.hub_dataset import read_dataset_source

    problems = ProblemList("data.dataset")
    read = read_dataset_source(spec, root, problems)
    return _dataset_examples(read, data, task, problems, f"cannot load the dataset {read[2]}",
                             record, "name a split with examples in it")  # fmt: skip


def _dataset_examples(
    read: tuple[list[Row], list[str], str, str | None], data: DataSettings, task: str,
    problems: ProblemList, title: str, record: dict[str, Any] | None, empty_fix: str,
) -> list[Example]:  # fmt: skip
    """A dataset's rows (saved with save_to_disk, or from load_dataset) as examples: its
    label and fingerprint into `record` (D1), every problem at once."""
    rows, columns, label, fingerprint = read
    problems.raise_if_any(title)
    if record is not None:
        record.update(source=label, fingerprint=fingerprint)
    if not rows:
        problems.add(label, "no rows", empty_fix)
    problems.raise_if_any(title)
    examples = _to_examples(Path(label), rows, columns, data, task, problems)
    problems.raise_if_any(title)
    return examples


def load_file(
    path: Path,
    data: DataSettings,
    task: str,
    split_name: str | None = None,
    record: dict[str, Any] | None = None,
) -> list[Example]:
    """Every example of one file, in file order; raises InputError listing every problem.

    A saved Hugging Face dataset folder is read too (saved_dataset.py); `record`, when given,
    receives its source label and fingerprint for the data version (D1)."""
    path = Path(path)
    problems = ProblemList(str(path))
    title = f"cannot load the {split_name} file {path}" if split_name else f"cannot load {path}"
    saved = saved_dataset(path)
    if saved is not None:
        return _dataset_examples(read_saved_dataset(saved, split_name, problems), data, task,
                                 problems, title, record, "save a dataset with examples in it")
    if not path.exists():
        problems.add(
            str(path),
            "no such file",
            "check `data.file` / `data.files` (relative paths start at the campaign folder)",
        )
    elif not path.is_file():
        problems.add(
            str(path),
            "a folder, not a file (nor a saved Hugging Face dataset)",
            "point the data setting at one file, or at a folder written by "
            "`dataset.save_to_disk(folder)`",
        )
    problems.raise_if_any(title)
    fmt = detect_format(path, data.format, problems)
    problems.raise_if_any(title)
    rows, columns = [], []
    if fmt == "parquet":
        rows, columns = _read_parquet(path, problems)
    else:
        lines = _decode_lines(path, path.read_bytes(), problems)
        if not any(line.strip() for line in lines):
            problems.add(f"{path}:1", "the file is empty", "give a file with examples in it")
        elif fmt == "jsonl":
            rows, columns = _read_jsonl(path, lines, problems)
        else:
            rows, columns = _read_delimited(path, lines, fmt, data, problems)
    problems.raise_if_any(title)
    if not rows:
        problems.add(f"{path}:1", "no examples (only a header or blank lines)", "add rows")
    problems.raise_if_any(title)
    if fmt in ("csv", "tsv") and data.header and data.columns is None:
        _refuse_headerless(path, rows, columns, data, problems)
        problems.raise_if_any(title)
    examples = _to_examples(path, rows, columns, data, task, problems)
    problems.raise_if_any(title)
    return examples


def _refuse_headerless(
    path: Path, rows: list[Row], columns: list[str], data: DataSettings, problems: ProblemList
) -> None:
    """Declared fields missing from a header that is really the first example: say so, with
    the settings that read the file right (the generic "no such column" would mislead)."""
    f = data.fields
    declared = [n for n in (f.id, f.text, f.label, f.target, f.group, f.time, *f.context) if n]
    if all(name in columns for name in declared):
        return
    found = header_looks_like_data(rows, columns, data)
    if found is None:
        return
    why, names = found
    problems.add(
        f"{path}:1 data.header",
        f"the first line is read as the header but looks like an example ({why}); the "
        f"declared fields {', '.join(f'`{n}`' for n in declared if n not in columns)} are not "
        "in it",
        f"if the file has no header, set `data.header: false` and `data.columns: "
        f"[{', '.join(names)}]` (one name per column, in file order)",
    )


def _to_examples(
    path: Path,
    rows: list[Row],
    columns: list[str],
    data: DataSettings,
    task: str,
    problems: ProblemList,
) -> list[Example]:
    f = data.fields
    mapped = {"id": f.id, "text": f.text, "label": f.label, "target": f.target, "group": f.group}
    mapped |= {"time": f.time} | {f"context[{i}]": name for i, name in enumerate(f.context)}
    if data.chat is not None:  # the turns hold the text and the answer
        del mapped["text"], mapped["target"]
        mapped["chat.field_messages"] = data.chat.field_messages
    absent = {name for name in mapped.values() if name and name not in columns}
    for role, name in mapped.items():
        if name in absent:  # a wrong field name: one problem, not one per row
            close = difflib.get_close_matches(name, columns, n=1, cutoff=0.5)
            hint = f"did you mean `{close[0]}`? " if close else ""
            shown = ", ".join(columns[:30]) + (" ..." if len(columns) > 30 else "")
            key = role if role.startswith("chat.") else f"fields.{role.split('[')[0]}"
            problems.add(
                f"{path}:1 data.{key}",
                f"column `{name}` is in no row",
                f"{hint}the columns are: {shown}",
            )
    reader = _RowReader(path, data, task, absent, problems)
    seen_ids: dict[str, int] = {}
    unknown: dict[str, list[int]] = {}
    examples: list[Example] = []
    for line, row in rows:
        before = problems.count
        example = reader.example(line, row)
        if example is None:
            continue
        if example.id in seen_ids:
            problems.add(
                example.source,
                f"id `{example.id}` already used on line {seen_ids[example.id]}",
                f"make `{f.id}` unique (ids name examples in splits and the test seal)",
            )
        seen_ids.setdefault(example.id, line)
        if data.labels and example.label is not None and example.label not in data.labels:
            unknown.setdefault(example.label, []).append(line)
        elif problems.count == before:
            examples.append(example)
    for label, lines in sorted(unknown.items()):
        close = difflib.get_close_matches(label, data.labels or [], n=1)
        hint = f"did you mean `{close[0]}`? " if close else ""
        more = f" and {len(lines) - 5} more" if len(lines) > 5 else ""
        problems.add(
            f"{path}:{lines[0]}",
            f"label `{label}` (lines {', '.join(map(str, lines[:5]))}{more}) is not in "
            "`data.labels`",
            f"{hint}allowed: {', '.join(data.labels or [])}; fix the rows or extend `data.labels`",
        )
    return examples


@dataclass
class _RowReader:
    """One parsed row -> one Example, adding a problem for every bad value it meets."""

    path: Path
    data: DataSettings
    task: str
    absent: set[str]
    problems: ProblemList

    def example(self, line: int, row: dict[str, Any]) -> Example | None:
        f, where = self.data.fields, f"{self.path}:{line}"
        ex_id = self.scalar(row, f.id, where) if f.id else f"{self.path.stem}:{line}"
        messages = None
        if self.data.chat is not None:
            messages, text, target = self.conversation(row, where)
        else:
            text = self.text(row, where)
            target = self.value(row, f.target, where)
        # A chat answer is text unless the campaign extracts JSON from it.
        json_tasks = ("extraction",) if self.data.chat is not None else ("extraction", "format")
        if target is not None and self.task in json_tasks:
            target = self.parse_target(target, where)
        context = {n: _plain(row.get(n), where, n, self.problems) for n in f.context}
        label, group = self.scalar(row, f.label, where), self.scalar(row, f.group, where)
        when = self.scalar(row, f.time, where)  # every value checked, even on a bad row
        if ex_id is None or text is None:
            return None
        return Example(
            id=ex_id,
            text=text,
            source=where,
            label=label,
            target=target,
            group=group,
            time=when,
            context={k: v for k, v in context.items() if k not in self.absent},
            messages=messages,
        )

    def conversation(
        self, row: dict[str, Any], where: str
    ) -> tuple[list[dict[str, str]] | None, str | None, str | None]:
        """(turns, input text, last answer) of a chat row; all None when the row is bad."""
        chat = self.data.chat
        assert chat is not None
        if chat.field_messages in self.absent:
            return None, None, None
        value = _plain(row.get(chat.field_messages), where, chat.field_messages, self.problems)
        turns = read_conversation(value, where, chat, self.problems)
        if turns is None:
            return None, None, None
        return turns, input_text(turns), last_answer(turns)

    def value(self, row: dict[str, Any], name: str | None, where: str) -> Any:
        """A mapped column's value; a mapped column must be filled on every row."""
        if not name or name in self.absent:
            return None
        value = row.get(name)
        if value is None or value == "":
            self.problems.add(where, f"missing `{name}`", f"fill `{name}` or remove the row")
            return None
        return _plain(value, where, name, self.problems)

    def scalar(self, row: dict[str, Any], name: str | None, where: str) -> str | None:
        """Ids, labels, groups and times compare as strings: 1 and "1" are the same class."""
        value = self.value(row, name, where)
        if isinstance(value, dict | list):
            self.problems.add(where, f"`{name}` holds a {type(value).__name__}", "give one value")
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        return None if value is None else str(value)

    def text(self, row: dict[str, Any], where: str) -> str | None:
        """Empty text is an error unless the campaign declares `drop_empty` (then cleaning
        drops and counts it): either way nothing disappears without being reported."""
        name = self.data.fields.text
        if name in self.absent:
            return None
        value = row.get(name)
        if value is None or (isinstance(value, str) and not value.strip()):
            if "drop_empty" in self.data.cleaning:
                return value or ""
            self.problems.add(
                where,
                f"empty text in `{name}`",
                "fill or remove the row, or add `drop_empty` to `data.cleaning`",
            )
            return None
        if not isinstance(value, str):
            self.problems.add(where, f"text `{name}` is a {type(value).__name__}", "quote it")
            return None
        return value

    def parse_target(self, value: Any, where: str) -> Any:
        """The JSON answer: an object/array as is, or a JSON string (CSV) parsed."""
        name = self.data.fields.target or "the last assistant turn"
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except RecursionError:
                self.problems.add(where, f"target `{name}`: {NESTED_TOO_DEEP}", FLATTEN_IT)
                return None
            except json.JSONDecodeError as exc:
                self.problems.add(
                    where,
                    f"target `{name}` is not valid JSON ({exc.msg} at column {exc.colno})",
                    'write it as a JSON object, e.g. {"field": "value"} '
                    "(in CSV, double the inner quotes)",
                )
                return None
        if not isinstance(value, dict | list):
            self.problems.add(
                where,
                f"target `{name}` is a JSON {type(value).__name__}, not an object or array",
                'write the answer as a JSON object such as {"field": "value"}',
            )
            return None
        return value


def _plain(value: Any, where: str, name: str, problems: ProblemList) -> Any:
    """JSON-safe values only (the data version hashes them): dates become ISO strings."""
    if isinstance(value, datetime | date | dtime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            problems.add(where, f"`{name}` holds non-UTF-8 bytes", "store it as UTF-8 text")
            return None
    if isinstance(value, dict):
        return {str(k): _plain(v, where, name, problems) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, where, name, problems) for v in value]
    return value
