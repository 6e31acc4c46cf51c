"""The ledger: one SQLite file per campaign (`<campaign folder>/tunepilot.db`) that remembers
every run, every status change, curves, evaluations with per-example predictions, every look
at the sealed test split, notebook entries and the hypothesis (H1, H3, H4, V3, V5, L4).

Why SQLite (stdlib, WAL) and not loose files: several processes write at once (`run --jobs N`,
a `note` typed while a sweep runs) and each write must land whole or not at all. Every write
is one short `BEGIN IMMEDIATE` transaction (the write lock is taken up front, so writers queue
instead of failing half-way), retried with backoff while another process holds the lock.
Readers never block writers in WAL mode.

The curve is stored as one row per update (`updates`), next to a pointer to the run's
metrics.jsonl (`runs.metrics_file`, the loop's full record): `compare` and the report read
the curves of many runs with one query, and 200 updates x a few dozen runs is small.

What is stored, and why nothing is ever rewritten: `ledger_schema.py`.
"""

from __future__ import annotations

import os
import random
import re
import socket
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tunepilot.errors import input_error, storage_error
from tunepilot.ledger.decisions import DecisionRecords
from tunepilot.ledger.evidence import EvidenceRecords
from tunepilot.ledger.facts import RunFacts
from tunepilot.ledger.liveness import RunLiveness
from tunepilot.ledger.paths import (
    default_run_dir,
    refuse_lost_history,
    relocation_note,
    run_row,
    to_stored,
)
from tunepilot.ledger.schema import (
    BASELINE,
    MIGRATIONS,
    SCHEMA_VERSION_DDL,
    TRANSITIONS,
    CurvePoint,
    DeadRun,
    Evaluation,
    HypothesisEntry,
    Note,
    Prediction,
    RunRow,
    StatusChange,
    TestLook,
    dumps,
    insert,
    utc_now,
)
from tunepilot.ledger.statuses import StatusHistory

__all__ = [
    "BASELINE",
    "DB_NAME",
    "CurvePoint",
    "DeadRun",
    "Evaluation",
    "HypothesisEntry",
    "Ledger",
    "Note",
    "Prediction",
    "RunRow",
    "StatusChange",
    "TestLook",
]

DB_NAME = "tunepilot.db"
BUSY_TIMEOUT_S = 10.0  # SQLite waits this long for the write lock within one attempt
WRITE_DEADLINE_S = 120.0  # then we back off and try again until this much time has passed
DEFAULT_HEARTBEAT_TIMEOUT_S = 900.0  # judges runs on other hosts only (see dead_reason)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # ids name folders
T = TypeVar("T")


class Ledger(StatusHistory, RunLiveness, EvidenceRecords, RunFacts, DecisionRecords):
    """An open ledger: `with Ledger.open(campaign_folder) as ledger: ...`.

    One connection per process; a Ledger must not cross a fork (open it again in the child).
    """

    def __init__(self, conn: sqlite3.Connection, path: Path, heartbeat_timeout_s: float) -> None:
        self._conn, self.path = conn, path
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._owner_pid, self._host = os.getpid(), socket.gethostname()
        self.interrupted_on_open: list[DeadRun] = []

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        mark_dead: bool = True,
        heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
    ) -> Ledger:
        """Open (or create) the ledger of a campaign folder, or the given .db file.

        Every command opens the ledger this way, so a run whose process died is marked
        `interrupted` by the next command (V3); those are listed in `interrupted_on_open`.
        """
        p = Path(path)
        db = p / DB_NAME if p.is_dir() else p
        if not db.parent.is_dir():
            raise input_error(str(db), "its folder does not exist", "create it or fix the path")
        refuse_lost_history(db)
        conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.row_factory = sqlite3.Row
        ledger = cls(conn, db, heartbeat_timeout_s)
        try:
            mode = ledger._retrying(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
            if str(mode).lower() != "wal":
                raise input_error(str(db), f"SQLite refused WAL mode ({mode})", "use a local disk")
            conn.execute("PRAGMA synchronous=FULL")  # a committed result survives a power cut
            conn.execute("PRAGMA foreign_keys=ON")
            ledger._write(ledger._migrate)
            if mark_dead:
                ledger.interrupted_on_open = ledger.mark_dead_runs_interrupted()
        except sqlite3.DatabaseError as exc:
            conn.close()
            if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                raise
            raise _open_error(db, exc) from None
        except BaseException:
            conn.close()
            raise
        return ledger

    def close(self) -> None:
        self._conn.close()

    @property
    def root(self) -> Path:
        """The campaign folder: every path the ledger stores is relative to it."""
        return self.path.parent

    def run_folder(self, run: str | RunRow) -> Path:
        """A run's folder under the *current* campaign folder (ledger/paths.py)."""
        row = self.get_run(run) if isinstance(run, str) else run
        return self.root / (row.run_dir or default_run_dir(row.id))

    def relocation_note(self) -> str | None:
        """A sentence when old rows point outside this folder (it was moved or copied)."""
        return relocation_note(self.root, self.list_runs())

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute(SCHEMA_VERSION_DDL)
        have = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
        if have > len(MIGRATIONS):
            raise input_error(
                str(self.path),
                f"ledger schema version {have}, newer than this tunepilot ({len(MIGRATIONS)})",
                "upgrade tunepilot before opening this campaign",
            )
        for m in MIGRATIONS[have:]:
            for statement in m.statements:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_version VALUES (?, ?, ?)", (m.version, m.description, utc_now())
            )

    def schema_version(self) -> int:
        return int(self._rows("SELECT max(version) FROM schema_version")[0][0])

    # -- transactions ------------------------------------------------------------------------
    def _retrying(self, fn: Callable[[], T]) -> T:
        """fn, tried again with jittered backoff while another process holds the lock."""
        if os.getpid() != self._owner_pid:
            raise RuntimeError("a Ledger was used across a fork; open it again in this process")
        deadline, attempt = time.monotonic() + WRITE_DEADLINE_S, 0
        while True:
            try:
                return fn()
            except sqlite3.DatabaseError as exc:
                if not _is_busy(exc) or time.monotonic() > deadline:
                    err = storage_error(exc, self.path)  # a full disk, a read-only folder
                    if err is not None:
                        raise err from None
                    raise
                attempt += 1
                time.sleep(random.uniform(0, min(0.01 * 2**attempt, 0.5)))

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """fn inside one BEGIN IMMEDIATE transaction: all of its rows land, or none."""

        def attempt() -> T:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(self._conn)
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            return result

        return self._retrying(attempt)

    def _rows(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        return self._retrying(lambda: self._conn.execute(sql, tuple(args)).fetchall())

    def _require_run(
        self, conn: sqlite3.Connection, run_id: str, baseline_ok: bool = False
    ) -> None:
        if (baseline_ok and run_id == BASELINE) or conn.execute(
            "SELECT 1 FROM runs WHERE id = ?", (run_id,)
        ).fetchone():
            return
        latest = [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY rowid DESC LIMIT 3")]
        raise input_error(
            f"run {run_id}",
            "no such run in this ledger",
            f"use an id from `tunepilot runs` (latest: {', '.join(latest) or 'none yet'})"
            + (f" or {BASELINE!r}" if baseline_ok else ""),
        )

    # -- run ids and runs (V1, V2, V3) -------------------------------------------------------
    def _allocate(self, conn: sqlite3.Connection, variant: str, seed: int) -> str:
        if not isinstance(variant, str) or not _NAME.match(variant):
            raise input_error("variant", repr(variant), "use letters, digits, '.', '_', '-'")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise input_error("seed", repr(seed), "use a non-negative integer")
        sql = "SELECT coalesce(max(n), 0) FROM run_ids WHERE variant = ? AND seed = ?"
        n = conn.execute(sql, (variant, seed)).fetchone()[0] + 1
        while conn.execute(
            "SELECT 1 FROM run_ids WHERE id = ?", (f"{variant}-s{seed}-{n}",)
        ).fetchone():
            n += 1  # an explicit id already took this name: skip it, never share it
        run_id = f"{variant}-s{seed}-{n}"
        insert(conn, "run_ids", id=run_id, variant=variant, seed=seed, n=n,
               reserved_at=utc_now(), pid=os.getpid(), host=self._host)  # fmt: skip
        return run_id

    def new_run_id(self, variant: str, seed: int) -> str:
        """Reserve `<variant>-s<seed>-<n>`: stable and never handed out twice, across processes."""
        return self._write(lambda conn: self._allocate(conn, variant, seed))

    def register_run(
        self,
        *,
        campaign: str,
        variant: str,
        seed: int,
        config_hash: str,
        data_version: str,
        eval_config_hash: str | None = None,
        control_run: str | None = None,
        diff: Mapping[str, Any] | None = None,
        budget: Mapping[str, Any] | None = None,
        run_dir: str | Path | None = None,
        metrics_file: str | Path | None = None,
        run_id: str | None = None,
        retry_of: str | None = None,
        status: str = "planned",
        reason: str = "",
    ) -> str:
        """Record a run as planned (or running) and return its id (V1, V2).

        `run_id`: one reserved with `new_run_id`, a fresh explicit id, or None to reserve one
        in the same transaction (then the id never exists without its row). `control_run`:
        the control's run id, or the control variant's name. `run_dir` defaults to
        runs/<id>; it is stored relative to the campaign folder, so a copied folder reads
        its own runs.
        """
        if status not in TRANSITIONS[None]:
            raise input_error("status", repr(status), "register a run as planned or running")
        for key, value in (("config_hash", config_hash), ("data_version", data_version)):
            if not value:
                raise input_error(key, "empty", "record what the run trains on (V2)")
        diff_json = dumps(dict(diff or {}), "diff")
        budget_json = dumps(dict(budget or {}), "budget")
        run_dir = to_stored(self.root, run_dir, "run_dir")
        metrics_file = to_stored(self.root, metrics_file, "metrics_file")

        def write(conn: sqlite3.Connection) -> str:
            rid = run_id or self._allocate(conn, variant, seed)
            if conn.execute("SELECT 1 FROM runs WHERE id = ?", (rid,)).fetchone():
                raise input_error(f"run {rid}", "already registered", "ids are never reused")
            if not conn.execute("SELECT 1 FROM run_ids WHERE id = ?", (rid,)).fetchone():
                if not _NAME.match(rid) or rid == BASELINE:
                    raise input_error("run_id", repr(rid), "use letters, digits, '.', '_', '-'")
                insert(
                    conn, "run_ids", id=rid, reserved_at=utc_now(), pid=os.getpid(), host=self._host
                )
            if retry_of is not None:
                self._require_run(conn, retry_of)
            folder = run_dir or default_run_dir(rid)
            metrics = metrics_file or f"{folder}/metrics.jsonl"
            # fmt: off
            values = dict(id=rid, campaign=campaign, variant=variant, seed=seed,
                          control_run=control_run, retry_of=retry_of, config_hash=config_hash,
                          data_version=data_version, eval_config_hash=eval_config_hash,
                          diff=diff_json, budget=budget_json, run_dir=folder,
                          metrics_file=metrics)
            # fmt: on
            insert(conn, "runs", created_at=utc_now(), pid=os.getpid(), host=self._host, **values)
            self._insert_status(conn, rid, status, reason, None)
            return rid

        return self._write(write)

    def retry(
        self,
        run_id: str,
        reason: str = "",
        *,
        config_hash: str | None = None,
        diff: Mapping[str, Any] | None = None,
        budget: Mapping[str, Any] | None = None,
        run_dir: str | Path | None = None,
    ) -> str:
        """A new attempt: a new id whose `retry_of` names the original, which keeps its line
        (V3). Pass what changed (another batch: `config_hash`, `diff`); the rest is copied."""
        old = self.get_run(run_id)
        if old.status == "running":
            raise input_error(f"run {run_id}", "is still running", "wait for it or stop it first")
        kept = ("campaign", "variant", "seed", "data_version", "eval_config_hash", "control_run")
        return self.register_run(
            **{k: getattr(old, k) for k in kept},
            config_hash=config_hash or old.config_hash,
            diff=old.diff if diff is None else diff,
            budget=old.budget if budget is None else budget,
            run_dir=run_dir,  # None: runs/<new id>
            retry_of=run_id,
            reason=f"retry of {run_id}" + (f": {reason}" if reason else ""),
        )

    _RUNS_SQL = """SELECT r.*, s.status, s.reason, s.at AS status_at, h.at AS heartbeat_at
        FROM runs r JOIN run_status s ON s.id = (SELECT max(id) FROM run_status WHERE run_id = r.id)
        LEFT JOIN heartbeats h ON h.run_id = r.id"""

    def list_runs(self) -> list[RunRow]:
        """Every run in the order registered, failures included, with its current status."""
        return [run_row(r, self.root) for r in self._rows(self._RUNS_SQL + " ORDER BY r.rowid")]

    def get_run(self, run_id: str) -> RunRow:
        rows = self._rows(self._RUNS_SQL + " WHERE r.id = ?", (run_id,))
        if not rows:
            self._require_run(self._conn, run_id)
        return run_row(rows[0], self.root)


def _is_busy(exc: sqlite3.DatabaseError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _open_error(db: Path, exc: sqlite3.DatabaseError) -> Exception:
    """Why a ledger would not open, with a fix that never loses its history."""
    if not os.access(db.parent, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
        return input_error(
            str(db), f"the campaign folder {db.parent} is read-only ({exc}); the ledger "
            "needs to write beside itself even to read (SQLite WAL)",
            f"make it writable (`chmod -R u+w {db.parent}`) or copy the whole folder "
            "(`cp -a`) and work in the copy; keep the ledger file, it is the campaign's history",
            title="cannot open the ledger: read-only folder",
        )  # fmt: skip
    err = storage_error(exc, db)
    if err is not None:
        return err
    return input_error(
        str(db), f"not a readable ledger ({exc})",
        "restore tunepilot.db (with its -wal file) from a backup or a copy of the campaign "
        "folder; do not delete it, it is the campaign's history",
    )  # fmt: skip
