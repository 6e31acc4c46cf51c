"""Format readers: bytes on disk -> (line number, row) pairs, problems named by file and line.

JSONL, CSV, TSV (quoting on or off) and Parquet. Bytes are decoded line by line so a non-UTF-8
byte is reported with its line and byte offset instead of one opaque decode error. CSV is read
with `strict=True`: a quote that is text (raw TSV such as the SMS spam collection) would
otherwise merge lines silently. pyarrow is imported only for Parquet.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from tunepilot.campaign import DataSettings
from tunepilot.errors import ProblemList

_SUFFIX_FORMAT = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv"}
_SUFFIX_FORMAT |= {".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet"}
_QUOTING_FIX = (
    "check the quotes on that line; if quote characters are part of the text (raw TSV), "
    "set `data.quoting: false`"
)

Row = tuple[int, dict[str, Any]]  # (physical line or parquet row number, column -> value)

# JSON nested beyond Python's recursion limit cannot be parsed; no example needs it.
NESTED_TOO_DEEP = "JSON nested too deeply to read (beyond the parser's recursion limit)"
FLATTEN_IT = "flatten that value: an example is a JSON object of plain fields"


def detect_format(path: Path, declared: str, problems: ProblemList) -> str:
    """`data.format`, or the suffix; .txt / no suffix: tabs mean TSV, commas CSV."""
    if declared != "auto":
        return declared
    suffix = path.suffix.lower()
    if suffix in _SUFFIX_FORMAT:
        return _SUFFIX_FORMAT[suffix]
    with path.open("rb") as handle:
        first = handle.readline()
    if b"\t" in first:
        return "tsv"
    if b"," in first:
        return "csv"
    problems.add(
        str(path),
        f"cannot tell the format of a `{suffix or 'no suffix'}` file",
        "set `data.format` to jsonl, csv, tsv or parquet",
    )
    return "unknown"


def _decode_lines(path: Path, raw: bytes, problems: ProblemList) -> list[str]:
    """Split on LF (so numbers match editors for LF and CRLF files) and decode each line."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    pieces = raw.split(b"\n")
    if pieces and pieces[-1] == b"":
        pieces.pop()
    lines, offset = [], 0
    for number, piece in enumerate(pieces, start=1):
        try:
            text = piece.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.add(
                f"{path}:{number}",
                f"not UTF-8: byte 0x{piece[exc.start]:02x} at byte offset {offset + exc.start} "
                f"(column {exc.start + 1} of the line)",
                "re-save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
            )
            text = piece.decode("utf-8", errors="replace")
        lines.append(text + "\n")
        offset += len(piece) + 1
    return lines


def _read_jsonl(path: Path, lines: list[str], problems: ProblemList) -> tuple[list[Row], list[str]]:
    if lines and lines[0].lstrip().startswith("["):
        problems.add(
            f"{path}:1",
            "a JSON array, not JSON Lines",
            "write one JSON object per line (JSONL), e.g. `jq -c '.[]' in.json > out.jsonl`",
        )
        return [], []
    rows: list[Row] = []
    columns: dict[str, None] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.add(
                f"{path}:{number}",
                f"not valid JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})",
                "fix that line: one JSON object per line, double-quoted keys and strings",
            )
            continue
        except RecursionError:
            problems.add(f"{path}:{number}", NESTED_TOO_DEEP, FLATTEN_IT)
            continue
        if "\\u" in line and (half := _lone_surrogate(value)):
            column = line.lower().find(half) + 1
            problems.add(
                f"{path}:{number}",
                f"a lone UTF-16 surrogate escape `{half}`"
                + (f" (column {column})" if column else "") + ": half of a character pair, "
                "not a character, so the text cannot be written as UTF-8",
                "write the character itself, or its whole pair (e.g. `\\ud83d\\ude00` for "
                "one emoji); a lone half is usually text cut in the middle of a character",
            )
            continue
        if not isinstance(value, dict):
            problems.add(
                f"{path}:{number}",
                f"a JSON {type(value).__name__}, not an object",
                'write each line as an object such as {"text": ..., "label": ...}',
            )
            continue
        columns.update(dict.fromkeys(value))
        rows.append((number, value))
    return rows, list(columns)


def _lone_surrogate(value: Any) -> str | None:
    """The first lone UTF-16 surrogate (U+D800-U+DFFF) in the strings of a parsed JSON value,
    written as its escape (`\\ud800`), or None. json.loads joins a high-low pair into one
    character, so any surrogate left is half a pair: the first UTF-8 write of the text (a hash,
    the tokenizer, the ledger) would fail far from the file."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            half = next((c for c in node if "\ud800" <= c <= "\udfff"), None)
            if half is not None:
                return f"\\u{ord(half):04x}"
    return None


def _read_delimited(
    path: Path, lines: list[str], fmt: str, data: DataSettings, problems: ProblemList
) -> tuple[list[Row], list[str]]:
    """CSV / TSV with the physical line where each record starts (records may span lines)."""
    quoting = csv.QUOTE_MINIMAL if data.quoting else csv.QUOTE_NONE
    reader = csv.reader(
        iter(lines), delimiter="\t" if fmt == "tsv" else ",", quoting=quoting, strict=True
    )
    records, start = [], 1
    while True:
        try:
            record = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            problems.add(f"{path}:{start}", f"unreadable CSV record ({exc})", _QUOTING_FIX)
            start = reader.line_num + 1
            continue
        if record:
            records.append((start, record))
        start = reader.line_num + 1
    names = list(data.columns) if data.columns else None
    if data.header and records:
        line, header = records.pop(0)
        if names is not None and len(names) != len(header):
            problems.add(
                f"{path}:{line}",
                f"the header has {len(header)} columns but `data.columns` names {len(names)}",
                "make `data.columns` match the header, or remove it to use the header names",
            )
        names = names or [h.strip() for h in header]
        duplicates = sorted({n for n in names if names.count(n) > 1 or not n})
        if duplicates:
            problems.add(
                f"{path}:{line}",
                f"empty or repeated column names {duplicates}",
                "give every column a unique name in the header",
            )
    if names is None:
        problems.add(
            "data.columns",
            f"{path} has no header (`data.header: false`) and no column names",
            "list them, e.g. `columns: [label, text]`, or set `data.header: true`",
        )
        return [], []
    rows: list[Row] = []
    for line, record in records:
        if len(record) != len(names):
            multi = " (this record spans several lines)" if "\n" in "".join(record) else ""
            problems.add(
                f"{path}:{line}",
                f"{len(record)} fields where the header has {len(names)} "
                f"({', '.join(names)}){multi}",
                _QUOTING_FIX
                if data.quoting and '"' in "".join(record)
                else "quote fields that contain the separator, or fix the separators on that line",
            )
            continue
        rows.append((line, dict(zip(names, record, strict=True))))
    return rows, names


def _read_parquet(path: Path, problems: ProblemList) -> tuple[list[Row], list[str]]:
    """Rows numbered from 1 (there are no lines in Parquet)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        problems.add(str(path), "pyarrow is not installed", "pip install pyarrow")
        return [], []
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        problems.add(
            str(path),
            f"not a readable Parquet file ({str(exc).splitlines()[0][:160]})",
            "re-export it (e.g. `df.to_parquet(path)`) or give JSONL/CSV and set `data.format`",
        )
        return [], []
    rows = [(i + 1, row) for i, row in enumerate(table.to_pylist())]
    return rows, list(table.column_names)


# --------------------------------------------------------------------------------------------
# rows -> examples
# --------------------------------------------------------------------------------------------


def header_looks_like_data(
    rows: list[Row], columns: list[str], data: DataSettings
) -> tuple[str, list[str]] | None:
    """A CSV/TSV read with its first example as the header: (why, suggested column names).

    Called only when declared fields are missing from the header. The first line is data
    when one of its cells recurs as a value of its column further down (`ham` in the SMS
    collection), or reads like a sentence (more than 4 words). The suggestion names the
    column with the longest values `data.fields.text` and gives the other declared fields
    to the remaining columns in order.
    """
    values = {name: [str(row.get(name, "")) for _, row in rows[:2000]] for name in columns}
    why = ""
    for name in columns:
        if name and name in values[name]:
            why = f"`{name}` is also a value of that column further down"
            break
        if len(name.split()) > 4:
            why = f"`{name[:40]}...` reads like text, not a column name"
            break
    if not why:
        return None
    f = data.fields
    mean = {n: sum(map(len, v)) / max(1, len(v)) for n, v in values.items()}
    text_at = max(range(len(columns)), key=lambda i: mean[columns[i]])
    others = [n for n in (f.label, f.target, f.id, f.group, f.time, *f.context) if n]
    names = []
    for i in range(len(columns)):
        names.append(f.text if i == text_at else (others.pop(0) if others else f"column{i + 1}"))
    return why, names
