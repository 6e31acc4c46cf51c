"""Every decision `compare` reached, kept in order with the evidence it rests on (L4, V7).

A decision is two rows written in one transaction: a notebook entry a person reads next to
their own notes ("decision #3 ... adopt `lr-2e-4`"), and a `decisions` row (schema version 3)
holding the digest of its evidence, the adopted variant (NULL: the control stays) and the
comparison as `compare` showed it. Nothing is replaced: comparing again after new runs adds
decision #N+1 and #N stays. Comparing again on the same evidence with the same conclusion
adds nothing; the latest decision answers for it (`record_decision` returns it).

A part of `Ledger` (store.py). What the evidence is, and its digest, is decided where the
decision is made (experiments/decision_record.py); the ledger only keeps it.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from typing import Any

from tunepilot.errors import input_error
from tunepilot.ledger.core import LedgerPart
from tunepilot.ledger.schema import dumps, insert, utc_now


@dataclass(frozen=True)
class Decision:
    """One recorded decision: decision #id of the campaign."""

    id: int
    at: str
    evidence_sha256: str
    adopted: str | None
    decision: str
    body: dict[str, Any]
    note_id: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "at": self.at, "evidence_sha256": self.evidence_sha256,
                "adopted": self.adopted, "decision": self.decision,
                "note_id": self.note_id}  # fmt: skip


class DecisionRecords(LedgerPart):
    """The campaign's decisions, oldest first: methods of `Ledger`."""

    def record_decision(
        self, evidence_sha256: str, decision: str, adopted: str | None, body: dict[str, Any]
    ) -> tuple[Decision, bool]:
        """Record a decision unless the latest one has this evidence and this conclusion;
        returns (the decision that stands, whether it is new)."""
        if not decision or not decision.strip():
            raise input_error("decision", "empty text", "say what was decided")
        body_json = dumps(body, "decision body")

        def write(conn: sqlite3.Connection) -> tuple[int, bool]:
            last = conn.execute("SELECT id, evidence_sha256, adopted, decision FROM decisions "
                                "ORDER BY id DESC LIMIT 1").fetchone()  # fmt: skip
            if last is not None and tuple(last)[1:] == (evidence_sha256, adopted, decision):
                return int(last[0]), False
            number = int(conn.execute("SELECT coalesce(max(id), 0) + 1 FROM decisions")
                         .fetchone()[0])  # fmt: skip
            chosen = f"adopt `{adopted}`" if adopted else "keep the control"
            text = (f"decision #{number} (compare, evidence sha256 {evidence_sha256[:16]}): "
                    f"{chosen}. {decision}")  # fmt: skip
            note = insert(conn, "notebook", at=utc_now(), run_id=None, text=text)
            insert(conn, "decisions", id=number, at=utc_now(), evidence_sha256=evidence_sha256,
                   adopted=adopted, decision=decision, body=body_json, note_id=note,
                   pid=os.getpid(), host=self._host)  # fmt: skip
            return number, True

        number, new = self._write(write)
        return next(d for d in self.decisions() if d.id == number), new

    def decisions(self) -> list[Decision]:
        """Every decision in the order reached."""
        rows = self._rows("SELECT * FROM decisions ORDER BY id")
        return [Decision(r["id"], r["at"], r["evidence_sha256"], r["adopted"], r["decision"],
                         json.loads(r["body"]), r["note_id"]) for r in rows]  # fmt: skip
