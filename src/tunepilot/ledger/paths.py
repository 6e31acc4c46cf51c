"""Paths in the ledger are relative to the campaign folder, so a copied folder reads its own files.

A ledger that stored `/home/a/X/runs/control-s0-1` would, once `X` is copied to `Y`, make the
copy read (and export) the original's checkpoints next to its own metrics. So a run folder is
stored as `runs/control-s0-1` and resolved against the folder that holds the ledger *now*.

Ledgers written before this rule hold absolute paths. Rows are never rewritten (the ledger is
append-only), so they are interpreted on read: an absolute path inside the current campaign
folder is used as it is; one outside it (the folder was moved or copied) is never read, and
the run's folder is found by its id under `runs/` instead, with a note that says so.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path, PurePosixPath

from tunepilot.errors import input_error
from tunepilot.ledger.schema import RunRow

RUNS = "runs"


def default_run_dir(run_id: str) -> str:
    return f"{RUNS}/{run_id}"


def to_stored(root: Path, value: str | Path | None, key: str) -> str | None:
    """The form written to the ledger: relative to the campaign folder, with '/'."""
    if value is None:
        return None
    path = Path(value)
    if path.is_absolute():
        try:
            path = path.resolve().relative_to(root.resolve())
        except ValueError:
            raise input_error(
                key, f"{value} lies outside the campaign folder {root}",
                "keep every file of a run under the campaign folder (runs/<id>)",
            ) from None  # fmt: skip
    if ".." in path.parts:
        raise input_error(key, f"{value} leaves the campaign folder", "use runs/<id>")
    return path.as_posix()


def relative_text(root: Path, text: str) -> str:
    """A sentence for the ledger with the campaign folder's own path taken out: `X/runs/a`
    reads `runs/a`, so a reason ("... continue with `tunepilot resume RUN campaign.yaml`",
    a refused file's path) stays true in a copied or moved folder."""
    for form in dict.fromkeys((str(root.resolve()), str(root))):
        text = text.replace(f"{form}/", "").replace(form, ".")
    return text


def located(root: Path, run_id: str, stored: str | None, name: str = "") -> tuple[str, bool]:
    """(path relative to `root`, whether it had to be mapped by the run id).

    `name` is the file inside the run folder (metrics.jsonl) or "" for the folder itself.
    """
    fallback = default_run_dir(run_id) + (f"/{name}" if name else "")
    if not stored:
        return fallback, False
    path = PurePosixPath(stored) if not Path(stored).is_absolute() else Path(stored)
    if path.is_absolute():
        try:
            return Path(path).resolve().relative_to(root.resolve()).as_posix(), False
        except ValueError:
            return fallback, True
    if ".." in path.parts:
        return fallback, True
    return path.as_posix(), False


def run_row(r: sqlite3.Row, root: Path) -> RunRow:
    """A `runs` row as read: JSON columns decoded, paths relative to the current folder."""
    d = dict(r)
    d["diff"], d["budget"] = json.loads(d["diff"]), json.loads(d["budget"])
    recorded = d["run_dir"]
    d["run_dir"], moved = located(root, d["id"], recorded)
    d["metrics_file"], moved_metrics = located(root, d["id"], d["metrics_file"], "metrics.jsonl")
    if moved or moved_metrics:
        d["recorded_outside"] = recorded or d["metrics_file"]
    return RunRow(**d)


def relocation_note(root: Path, rows: list[RunRow]) -> str | None:
    """One sentence when the ledger recorded run folders outside this campaign folder."""
    moved = [r for r in rows if r.recorded_outside]
    if not moved:
        return None
    example = moved[0]
    return (
        f"{len(moved)} run folder(s) were recorded outside this campaign folder (e.g. "
        f"{example.recorded_outside}): the folder was moved or copied. They are read from "
        f"{root}/{RUNS}/<run id> (e.g. {example.run_dir}); the recorded paths are never read"
    )


def refuse_lost_history(db: Path) -> None:
    """A missing or empty ledger beside run folders tunepilot wrote means the history is lost
    (a truncated file, a copy that left it out): refused, because a fresh ledger would forget
    every run and hand their ids out again."""
    wal = db.with_name(db.name + "-wal")  # a ledger killed before its first checkpoint lives
    if any(f.is_file() and f.stat().st_size > 0 for f in (db, wal)):  # in its -wal file
        return
    written = sorted(p.parent.name for p in (db.parent / RUNS).glob("*/config.resolved.yaml"))
    if written:
        state = "is empty" if db.is_file() else "is missing"
        raise input_error(
            str(db), f"the ledger {state}, but {RUNS}/ holds {len(written)} run folder(s) it "
            f"recorded (e.g. {written[0]})",
            f"restore {db.name} (with its -wal file) from a backup or a copy of the campaign "
            f"folder; to start a new history on purpose, move {RUNS}/ aside first",
            title="the campaign's history is missing",
        )  # fmt: skip
