"""The run's JSONL records (metrics.jsonl, evals.jsonl): written by rank 0, one line per
event, rewound to a checkpoint on resume. Metrics are read back as JSONL, never scraped."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def finite_json(record: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN: a non-finite number becomes null plus its text (the line is kept)."""
    out = dict(record)
    for key, value in record.items():
        if isinstance(value, float) and not math.isfinite(value):
            out[key], out[f"{key}_text"] = None, str(value)
    return out


def write_line(path: Path, record: dict[str, Any], rank: int) -> None:
    if rank == 0:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, allow_nan=False) + "\n")


def rewind_jsonl(path: Path, update: int) -> None:
    """Keep the lines up to `update`, and drop a line that a kill cut in half."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["update"] <= update:
                kept.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
