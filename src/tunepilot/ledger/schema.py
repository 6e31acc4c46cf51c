"""What the ledger stores: the tables, their migrations, the run statuses and the row types.

Kept apart from `ledger.py` so the storage contract reads on one page. Three rules shape it:

- Nothing is deleted or overwritten (V3, L4). A status change is a new row in `run_status`;
  the current status is the latest row. Triggers make the rule hold for every writer, not
  only for code that remembers it: an UPDATE or DELETE on a recorded table aborts. The one
  exception is `heartbeats`, a liveness signal rather than a result, updated in place.
- Migrations only ever append: version N+1 is a list of statements run in one transaction on
  a ledger at version N, and `schema_version` records when each was applied.
- Values that SQLite cannot hold faithfully are written in a shape that reads back
  unchanged: dicts as JSON text written by Python's json (NaN allowed: a diverged run's
  metrics must be storable, so there is no `json_valid` check), gold and predicted values as
  JSON so an int label stays an int. A NaN loss is stored as NULL (SQLite turns NaN into
  NULL anyway) and read back as NaN.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tunepilot.errors import input_error

# -- statuses (V3) ---------------------------------------------------------------------------

STATUSES = ("planned", "running", "completed", "diverged", "interrupted", "invalid", "failed")
# A bad ending must say why, or the comparison cannot explain the missing line (V3).
NEEDS_REASON = frozenset({"diverged", "interrupted", "invalid", "failed"})
DEFAULT_REASON = {
    "planned": "registered",
    "running": "started",
    "completed": "finished its budget",
}
# Which status may follow which. A finished result is never replaced: a new attempt is a new
# run id (`Ledger.retry`). `interrupted` may be followed by `running` (resumed in place from
# its checkpoint) or by a late result from a process on another host whose heartbeat went
# quiet: the interrupted row stays in the history either way. Anything may later be declared
# `invalid` (e.g. leakage found after the fact), except what is already invalid.
TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({"planned", "running"}),
    "planned": frozenset({"running", "failed", "invalid", "interrupted"}),
    "running": frozenset({"completed", "diverged", "interrupted", "failed", "invalid"}),
    "interrupted": frozenset({"running", "completed", "diverged", "failed", "invalid"}),
    "completed": frozenset({"invalid"}),
    "diverged": frozenset({"invalid"}),
    "failed": frozenset({"invalid"}),
    "invalid": frozenset(),
}
SPLITS = ("train", "validation", "test")
BASELINE = "baseline"  # the run id under which the starting model's evaluations are kept (H3)

# -- tables ------------------------------------------------------------------------------------

_STATUS_CHECK = ", ".join(f"'{s}'" for s in STATUSES)
_SPLIT_CHECK = ", ".join(f"'{s}'" for s in SPLITS)

_TABLES_V1 = (
    """CREATE TABLE run_ids (
        id TEXT PRIMARY KEY,            -- reserved before the run row exists: never reused
        variant TEXT, seed INTEGER, n INTEGER,
        reserved_at TEXT NOT NULL, pid INTEGER NOT NULL, host TEXT NOT NULL)""",
    "CREATE INDEX run_ids_prefix ON run_ids(variant, seed, n)",
    """CREATE TABLE runs (
        id TEXT PRIMARY KEY REFERENCES run_ids(id),
        campaign TEXT NOT NULL,
        variant TEXT NOT NULL,
        seed INTEGER NOT NULL,
        control_run TEXT,               -- control run id, or the control variant's name
        retry_of TEXT REFERENCES runs(id),
        config_hash TEXT NOT NULL,
        data_version TEXT NOT NULL,
        eval_config_hash TEXT,
        diff TEXT NOT NULL,
        budget TEXT NOT NULL,
        run_dir TEXT,
        metrics_file TEXT,              -- the run's metrics.jsonl: the full record (V5)
        created_at TEXT NOT NULL,
        pid INTEGER NOT NULL,
        host TEXT NOT NULL)""",
    f"""CREATE TABLE run_status (
        id INTEGER PRIMARY KEY AUTOINCREMENT,   -- order of changes; the latest is current
        run_id TEXT NOT NULL REFERENCES runs(id),
        status TEXT NOT NULL CHECK (status IN ({_STATUS_CHECK})),
        reason TEXT NOT NULL,
        at TEXT NOT NULL,
        pid INTEGER NOT NULL,
        host TEXT NOT NULL)""",
    "CREATE INDEX run_status_run ON run_status(run_id, id)",
    """CREATE TABLE heartbeats (
        run_id TEXT PRIMARY KEY REFERENCES runs(id),
        pid INTEGER NOT NULL CHECK (pid > 0),
        host TEXT NOT NULL,
        proc_start REAL,                -- process start time: tells a reused pid apart
        started_at TEXT NOT NULL,
        at TEXT NOT NULL)""",
    """CREATE TABLE updates (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL REFERENCES runs(id),
        at_update INTEGER NOT NULL,
        loss REAL,                      -- NULL = NaN (a diverged update keeps its line)
        lr REAL,
        extra TEXT NOT NULL,
        at TEXT NOT NULL)""",
    "CREATE INDEX updates_run ON updates(run_id, at_update)",
    """CREATE TABLE test_looks (
        look_number INTEGER PRIMARY KEY,   -- 1, 2, 3 ... over the whole campaign (H4)
        run_id TEXT NOT NULL,
        config TEXT NOT NULL,
        config_hash TEXT NOT NULL,
        at TEXT NOT NULL,
        pid INTEGER NOT NULL,
        host TEXT NOT NULL)""",
    f"""CREATE TABLE evaluations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL,           -- a run id, or 'baseline' (H3)
        split TEXT NOT NULL CHECK (split IN ({_SPLIT_CHECK})),
        at_update INTEGER,
        metrics TEXT NOT NULL,
        eval_config_hash TEXT NOT NULL,
        data_version TEXT NOT NULL,
        test_look INTEGER REFERENCES test_looks(look_number),
        at TEXT NOT NULL,
        CHECK (split <> 'test' OR test_look IS NOT NULL))""",
    "CREATE INDEX evaluations_run ON evaluations(run_id, split)",
    """CREATE TABLE predictions (
        evaluation_id INTEGER NOT NULL REFERENCES evaluations(id),
        example_id TEXT NOT NULL,
        gold TEXT NOT NULL,
        pred TEXT NOT NULL,
        score REAL,                     -- the per-example score the paired bootstrap uses
        row TEXT NOT NULL,
        PRIMARY KEY (evaluation_id, example_id))""",
    """CREATE TABLE notebook (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL,
        run_id TEXT REFERENCES runs(id),
        text TEXT NOT NULL CHECK (length(trim(text)) > 0))""",
    """CREATE TABLE hypothesis (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        hash TEXT NOT NULL,
        body TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('original', 'amendment')),
        reason TEXT,
        at TEXT NOT NULL,
        CHECK (kind = 'original' OR length(trim(coalesce(reason, ''))) > 0))""",
    "CREATE UNIQUE INDEX hypothesis_one_original ON hypothesis(kind) WHERE kind = 'original'",
)
APPEND_ONLY = (
    "schema_version",
    "run_ids",
    "runs",
    "run_status",
    "updates",
    "test_looks",
    "evaluations",
    "predictions",
    "notebook",
    "hypothesis",
)


def _append_only_triggers(tables: tuple[str, ...]) -> tuple[str, ...]:
    out: list[str] = []
    for table in tables:
        for action in ("UPDATE", "DELETE"):
            out.append(
                f"CREATE TRIGGER {table}_no_{action.lower()} BEFORE {action} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, 'the tunepilot ledger keeps every row: "
                f"{action} on {table} refused; record a new row instead'); END"
            )
    return tuple(out)


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


_TABLES_V2 = (
    """CREATE TABLE run_facts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL REFERENCES runs(id),
        kind TEXT NOT NULL CHECK (kind IN ('trainable', 'export')),
        body TEXT NOT NULL,             -- JSON: see ledger/facts.py
        at TEXT NOT NULL)""",
    "CREATE INDEX run_facts_run ON run_facts(run_id, kind, id)",
)

_TABLES_V3 = (
    """CREATE TABLE decisions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,   -- decision #N of the campaign, in order
        at TEXT NOT NULL,
        evidence_sha256 TEXT NOT NULL,  -- the evaluations and rule inputs it rests on
        adopted TEXT,                   -- the adopted variant; NULL keeps the control (V7)
        decision TEXT NOT NULL CHECK (length(trim(decision)) > 0),
        body TEXT NOT NULL,             -- JSON: the comparison as `compare` showed it
        note_id INTEGER NOT NULL REFERENCES notebook(id),
        pid INTEGER NOT NULL,
        host TEXT NOT NULL)""",
    "CREATE INDEX decisions_evidence ON decisions(evidence_sha256, id)",
)

SCHEMA_VERSION_DDL = """CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at TEXT NOT NULL)"""
MIGRATIONS = (
    Migration(
        1,
        "runs, statuses, heartbeats, curves, evaluations, predictions, test looks, notebook, "
        "hypothesis; append-only triggers",
        _TABLES_V1 + _append_only_triggers(APPEND_ONLY),
    ),
    Migration(
        2,
        "run_facts: trainable parameters per run (P2), exported bundles with their digest",
        _TABLES_V2 + _append_only_triggers(("run_facts",)),
    ),
    Migration(
        3,
        "decisions: every comparison's decision with its evidence digest, beside its notebook "
        "entry (L4)",
        _TABLES_V3 + _append_only_triggers(("decisions",)),
    ),
)

# -- rows --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusChange:
    """One row of a run's status history."""

    run_id: str
    status: str
    reason: str
    at: str
    pid: int
    host: str


@dataclass(frozen=True)
class RunRow:
    """A run with its current status (the latest status row) and last heartbeat."""

    id: str
    campaign: str
    variant: str
    seed: int
    control_run: str | None
    retry_of: str | None
    config_hash: str
    data_version: str
    eval_config_hash: str | None
    diff: dict[str, Any]
    budget: dict[str, Any]
    run_dir: str | None
    metrics_file: str | None
    created_at: str
    pid: int
    host: str
    status: str
    reason: str
    status_at: str
    heartbeat_at: str | None = None
    # Set when the ledger recorded this run's folder outside the current campaign folder
    # (written before paths were stored relative, then moved or copied): never read.
    recorded_outside: str | None = None


@dataclass(frozen=True)
class DeadRun:
    """A run recorded as running whose process is gone or has gone quiet."""

    run_id: str
    pid: int
    host: str
    last_heartbeat: str
    reason: str


@dataclass(frozen=True)
class CurvePoint:
    """One optimizer update of a run's loss curve (V5)."""

    update: int
    loss: float
    lr: float | None
    extra: dict[str, Any] = field(default_factory=dict)
    at: str = ""


@dataclass(frozen=True)
class Prediction:
    """One example's evaluation output, kept so a gain limited to some examples shows (H3)."""

    example_id: str
    gold: Any
    pred: Any
    score: float | None = None
    row: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of a run (or of the baseline) on one split at one update."""

    id: int
    run_id: str
    split: str
    update: int | None
    metrics: dict[str, Any]
    eval_config_hash: str
    data_version: str
    test_look: int | None
    at: str
    n_predictions: int


@dataclass(frozen=True)
class TestLook:
    """One look at the sealed test split (H4)."""

    __test__ = False  # a row type, not a pytest class

    look_number: int
    run_id: str
    config: dict[str, Any]
    config_hash: str
    at: str


@dataclass(frozen=True)
class Note:
    """A notebook entry: a decision or an observation, timestamped (L4)."""

    id: int
    at: str
    run_id: str | None
    text: str


@dataclass(frozen=True)
class HypothesisEntry:
    """The hypothesis as first fixed, or an amendment with its reason (H1, H2)."""

    id: int
    hash: str
    body: dict[str, Any]
    kind: str
    reason: str | None
    at: str


# -- encoding ----------------------------------------------------------------------------------


def utc_now() -> str:
    """UTC, ISO 8601 with microseconds: sortable as text and unambiguous across machines."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def dumps(value: Any, where: str) -> str:
    """Canonical JSON for a stored value; a value JSON cannot hold is the caller's input error."""
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise input_error(where, f"a value JSON cannot hold ({exc})", "pass plain JSON") from None


def insert(conn: sqlite3.Connection, table: str, **values: Any) -> int:
    """INSERT one row by column name (names come from this package, never from input)."""
    cols = ", ".join(values)
    marks = ", ".join("?" * len(values))
    sql = f"INSERT INTO {table} ({cols}) VALUES ({marks})"
    return int(conn.execute(sql, tuple(values.values())).lastrowid or 0)


def loss_from_db(value: float | None) -> float:
    """SQLite stores NaN as NULL; a NULL loss was a NaN loss."""
    return math.nan if value is None else float(value)
