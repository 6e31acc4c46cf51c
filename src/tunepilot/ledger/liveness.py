"""Is a run recorded as `running` still alive? Heartbeats and dead-run detection (V3).

A training process can die without a word (SIGKILL, out-of-memory killer, a lost machine).
Its last status row still says `running`, and a comparison built on it would silently miss
a line. So the running process records its pid (with the process start time, which tells a
reused pid apart) and a heartbeat, and every command that opens the ledger marks the runs
whose process is gone as `interrupted`, with the pid and the last heartbeat as the reason.

A part of `Ledger` (ledger.py), split off to keep each file one chapter long.
"""

from __future__ import annotations

import os
import sqlite3
from datetime import UTC, datetime
from typing import Any

from tunepilot.errors import input_error
from tunepilot.ledger.core import LedgerPart
from tunepilot.ledger.schema import DeadRun, utc_now


class RunLiveness(LedgerPart):
    """Heartbeats and dead-run detection: methods of `Ledger`."""

    def _beat(self, conn: sqlite3.Connection, run_id: str, pid: int, at: str, fresh: bool) -> None:
        if pid <= 0:
            raise input_error("pid", str(pid), "give the run's process id")
        sql = "UPDATE heartbeats SET at = ? WHERE run_id = ? AND pid = ? AND host = ?"
        if not fresh and conn.execute(sql, (at, run_id, pid, self._host)).rowcount:
            return
        conn.execute(
            """INSERT INTO heartbeats VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(run_id) DO UPDATE SET
               pid = excluded.pid, host = excluded.host, proc_start = excluded.proc_start,
               started_at = excluded.started_at, at = excluded.at""",
            (run_id, pid, self._host, process_start(pid), at, at),
        )

    def heartbeat(self, run_id: str, *, pid: int | None = None) -> None:
        """Say the run's process is alive: every update, and during long evaluations."""

        def write(conn: sqlite3.Connection) -> None:
            self._require_run(conn, run_id)
            self._beat(conn, run_id, os.getpid() if pid is None else pid, utc_now(), fresh=False)

        self._write(write)

    def _dead(self, conn: sqlite3.Connection, timeout_s: float | None) -> list[DeadRun]:
        timeout = self.heartbeat_timeout_s if timeout_s is None else timeout_s
        rows = conn.execute(
            """SELECT r.id, coalesce(h.pid, s.pid) AS pid, coalesce(h.host, s.host) AS host,
                      coalesce(h.at, s.at) AS at, h.proc_start
               FROM runs r JOIN run_status s
                 ON s.id = (SELECT max(id) FROM run_status WHERE run_id = r.id)
               LEFT JOIN heartbeats h ON h.run_id = r.id
               WHERE s.status = 'running' ORDER BY r.rowid"""
        ).fetchall()
        now, dead = datetime.now(UTC), []
        for r in rows:
            why = dead_reason(dict(r), self._host, now, timeout)
            if why is not None:
                dead.append(DeadRun(r["id"], r["pid"], r["host"], r["at"], why))
        return dead

    def find_dead_runs(self, timeout_s: float | None = None) -> list[DeadRun]:
        """Runs recorded as running whose process is gone (this host) or silent (other host)."""
        return self._retrying(lambda: self._dead(self._conn, timeout_s))

    def mark_dead_runs_interrupted(self, timeout_s: float | None = None) -> list[DeadRun]:
        """Record `interrupted`, with the pid and last heartbeat as the reason, for each dead
        run. Found and written in one transaction, so a run finishing meanwhile is left alone."""

        def write(conn: sqlite3.Connection) -> list[DeadRun]:
            dead = self._dead(conn, timeout_s)
            for d in dead:
                self._insert_status(conn, d.run_id, "interrupted", d.reason, d.pid)
            return dead

        return self._write(write)


def process_start(pid: int) -> float | None:
    """The process's start time, stored with its heartbeat so a reused pid is not mistaken for
    the run's process. None when psutil (a declared dependency) cannot tell."""
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:  # noqa: BLE001  no psutil, no such process, access denied: unknown
        return None


def dead_reason(hb: dict[str, Any], here: str, now: datetime, timeout_s: float) -> str | None:
    """Why a run recorded as running has no live process, or None while it may be alive.

    On this host the pid is checked and is the whole truth: a live process is never declared
    dead, however quiet, because it may still write its result. On another host the pid means
    nothing here, so a heartbeat older than `timeout_s` is the evidence.
    """
    pid, host, last = int(hb["pid"]), str(hb["host"]), str(hb["at"])
    if host != here:
        age = (now - datetime.fromisoformat(last)).total_seconds()
        if age <= timeout_s:
            return None
        return (
            f"no heartbeat from process {pid} on {host} for {age:.0f} s (limit {timeout_s:.0f} s);"
            f" last heartbeat at {last}"
        )
    gone = _gone(pid, hb.get("proc_start"))
    return None if gone is None else f"process {pid} {gone}; last heartbeat at {last}"


def _gone(pid: int, proc_start: float | None) -> str | None:
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return "is gone"
    except PermissionError:
        pass  # exists, owned by another user: look closer below
    try:
        import psutil
    except ImportError:
        return None
    try:
        proc = psutil.Process(pid)
        status, started = proc.status(), proc.create_time()
    except psutil.NoSuchProcess:
        return "is gone"
    except psutil.AccessDenied:
        return None
    if status == psutil.STATUS_ZOMBIE:
        return "has exited (a zombie its parent has not reaped)"
    if proc_start is not None and abs(started - proc_start) > 1.0:
        return "is gone (its pid now belongs to a later process)"
    return None
