"""A run's status history (V3): appended, never rewritten, each change with its reason.

Allowed transitions and the statuses that need a reason live in `schema.py`; a `running` row
also records the process whose disappearance marks the run interrupted (`liveness.py`).
A part of `Ledger` (store.py), split off to keep each file one chapter long.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import asdict

from tunepilot.errors import input_error
from tunepilot.ledger.core import LedgerPart
from tunepilot.ledger.paths import relative_text
from tunepilot.ledger.schema import (
    DEFAULT_REASON,
    NEEDS_REASON,
    STATUSES,
    TRANSITIONS,
    StatusChange,
    insert,
    utc_now,
)


class StatusHistory(LedgerPart):
    """Status rows: methods of `Ledger`."""

    def _insert_status(
        self, conn: sqlite3.Connection, run_id: str, status: str, reason: str, pid: int | None
    ) -> StatusChange:
        if status not in STATUSES:
            raise input_error("status", repr(status), f"use one of: {', '.join(STATUSES)}")
        reason = relative_text(self.root, reason.strip())
        if not reason and status in NEEDS_REASON:
            raise input_error(f"run {run_id}", f"status {status} without a reason", "say why (V3)")
        cur = conn.execute(
            "SELECT status FROM run_status WHERE run_id = ? ORDER BY id DESC LIMIT 1", (run_id,)
        ).fetchone()
        before = None if cur is None else cur[0]
        if status not in TRANSITIONS[before]:
            allowed = ", ".join(sorted(TRANSITIONS[before])) or "nothing"
            raise input_error(
                f"run {run_id}",
                f"status {before} cannot become {status} (allowed: {allowed})",
                "a finished run keeps its result; start a new attempt with `retry` (V3)",
            )
        pid = os.getpid() if pid is None else pid
        row = StatusChange(
            run_id, status, reason or DEFAULT_REASON[status], utc_now(), pid, self._host
        )
        insert(conn, "run_status", **asdict(row))
        if status == "running":
            self._beat(conn, run_id, pid, row.at, fresh=True)
        return row

    def set_status(
        self, run_id: str, status: str, reason: str = "", *, pid: int | None = None
    ) -> StatusChange:
        """Append a status row. `running` also records the process (`pid`, default: this one)
        whose disappearance marks the run interrupted."""

        def write(conn: sqlite3.Connection) -> StatusChange:
            self._require_run(conn, run_id)
            return self._insert_status(conn, run_id, status, reason, pid)

        return self._write(write)

    def current_status(self, run_id: str) -> StatusChange:
        return self.status_history(run_id)[-1]

    def status_history(self, run_id: str) -> list[StatusChange]:
        """Every status the run has had, oldest first."""
        rows = self._rows("SELECT * FROM run_status WHERE run_id = ? ORDER BY id", (run_id,))
        if not rows:
            self._require_run(self._conn, run_id)
        return [
            StatusChange(r["run_id"], r["status"], r["reason"], r["at"], r["pid"], r["host"])
            for r in rows
        ]
