"""What every part of `Ledger` may use: declared once here, supplied by `store.Ledger`.

The ledger's methods live in parts (statuses, liveness, evidence, facts), each one chapter;
they share the connection, the host name and the write/read helpers that `store.py` defines.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pathlib import Path

    from tunepilot.ledger.schema import StatusChange

T = TypeVar("T")


class LedgerPart:
    """Base of every part of `Ledger`; the attributes and helpers below are Ledger's."""

    if TYPE_CHECKING:
        _conn: sqlite3.Connection
        _host: str
        heartbeat_timeout_s: float

        @property
        def root(self) -> Path: ...

        def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...
        def _retrying(self, fn: Callable[[], T]) -> T: ...
        def _rows(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]: ...
        def _require_run(
            self, conn: sqlite3.Connection, run_id: str, baseline_ok: bool = False
        ) -> None: ...
        def _insert_status(
            self, conn: sqlite3.Connection, run_id: str, status: str, reason: str, pid: int | None
        ) -> StatusChange: ...
        def _beat(
            self, conn: sqlite3.Connection, run_id: str, pid: int, at: str, fresh: bool
        ) -> None: ...
