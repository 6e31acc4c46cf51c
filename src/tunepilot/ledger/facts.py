"""Facts about a run recorded once each, as insert-only rows (`run_facts`, schema version 2).

* `trainable` (P2): what a run trains: trainable and frozen parameter counts, the LoRA target
  modules and the modules adapted, rank and alpha, and the extra layers saved whole
  (`modules_to_save`). Recorded when the run's model is built, so a comparison can say two
  runs train the same parameters without rebuilding either.
* `export` (R3): a bundle written from the run, its folder (relative to the campaign folder)
  and the sha256 of its MANIFEST.json: the one digest that pins every file of the bundle, for
  `tunepilot verify DIR --expect SHA`.

A part of `Ledger` (store.py); a later fact of the same kind is a new row, never an edit.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from tunepilot.ledger.core import LedgerPart
from tunepilot.ledger.schema import dumps, insert, utc_now

KINDS = ("trainable", "export")


class RunFacts(LedgerPart):
    """Insert-only facts per run: methods of `Ledger`."""

    def record_fact(self, run_id: str, kind: str, body: dict[str, Any]) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        text = dumps(body, kind)

        def write(conn: sqlite3.Connection) -> None:
            self._require_run(conn, run_id)
            insert(conn, "run_facts", run_id=run_id, kind=kind, body=text, at=utc_now())

        self._write(write)

    def facts(self, kind: str, run_id: str | None = None) -> list[dict[str, Any]]:
        """Every fact of `kind` (of one run, or of all), oldest first, with run_id and at."""
        import json

        sql, args = "SELECT * FROM run_facts WHERE kind = ?", [kind]
        if run_id is not None:
            sql, args = sql + " AND run_id = ?", [*args, run_id]
        return [{**json.loads(r["body"]), "run_id": r["run_id"], "at": r["at"]}
                for r in self._rows(sql + " ORDER BY id", args)]  # fmt: skip
