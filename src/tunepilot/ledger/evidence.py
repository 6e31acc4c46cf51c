"""What runs leave behind, as the ledger keeps it: curves (V5), evaluations with per-example
predictions (H3), looks at the sealed test split (H4), the notebook (L4) and the hypothesis
with its amendments (H1, H2).

A part of `Ledger` (ledger.py), split off only to keep each file one chapter long: `Ledger`
inherits these methods and supplies the transaction helpers declared below. Nothing here is
meant to be used on its own.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from tunepilot.errors import input_error
from tunepilot.ledger.core import LedgerPart
from tunepilot.ledger.schema import (
    SPLITS,
    CurvePoint,
    Evaluation,
    HypothesisEntry,
    Note,
    Prediction,
    TestLook,
    dumps,
    insert,
    loss_from_db,
    utc_now,
)


class EvidenceRecords(LedgerPart):
    """Curves, evaluations, test looks, notes and the hypothesis: methods of `Ledger`."""

    # -- curves (V5) -------------------------------------------------------------------------
    def record_updates(self, run_id: str, points: Iterable[Mapping[str, Any]]) -> int:
        """Append curve rows. Each point is a metrics.jsonl record with `update`, `loss` and
        `lr`; its other keys are kept in `extra`. Returns how many rows were written."""
        rows = []
        for i, p in enumerate(points):
            if "update" not in p or "loss" not in p:
                raise input_error(f"points[{i}]", f"keys {sorted(p)}", "give update and loss")
            extra = {k: v for k, v in p.items() if k not in ("update", "loss", "lr")}
            loss, lr = float(p["loss"]), p.get("lr")
            rows.append(
                (
                    run_id,
                    int(p["update"]),
                    None if math.isnan(loss) else loss,
                    None if lr is None else float(lr),
                    dumps(extra, f"points[{i}]"),
                    utc_now(),
                )
            )

        def write(conn: sqlite3.Connection) -> int:
            self._require_run(conn, run_id)
            sql = (
                "INSERT INTO updates (run_id, at_update, loss, lr, extra, at) VALUES (?,?,?,?,?,?)"
            )
            conn.executemany(sql, rows)
            return len(rows)

        return self._write(write)

    def record_update(
        self, run_id: str, update: int, loss: float, lr: float | None = None, **extra: Any
    ) -> None:
        self.record_updates(run_id, [{"update": update, "loss": loss, "lr": lr, **extra}])

    def curve(self, run_id: str) -> list[CurvePoint]:
        """One point per update; the latest row where an update was recorded twice (a resume)."""
        rows = self._rows(
            """SELECT * FROM updates WHERE id IN (SELECT max(id) FROM updates WHERE run_id = ?
               GROUP BY at_update) ORDER BY at_update""",
            (run_id,),
        )
        return [
            CurvePoint(
                r["at_update"], loss_from_db(r["loss"]), r["lr"], json.loads(r["extra"]), r["at"]
            )
            for r in rows
        ]

    # -- evaluations with predictions (H3, V5) and test looks (H4) ---------------------------
    def record_test_look(self, run_id: str, config: Mapping[str, Any]) -> int:
        """Count a look at the sealed test split, before the split is read, so a crash during
        the evaluation still counts (H4). Returns the look number over the whole campaign."""
        from tunepilot.campaign.schema import stable_hash

        config_json, config_hash = dumps(dict(config), "config"), stable_hash(dict(config))

        def write(conn: sqlite3.Connection) -> int:
            self._require_run(conn, run_id, baseline_ok=True)
            sql = "SELECT coalesce(max(look_number), 0) + 1 FROM test_looks"
            n = conn.execute(sql).fetchone()[0]
            insert(
                conn,
                "test_looks",
                look_number=n,
                run_id=run_id,
                config=config_json,
                config_hash=config_hash,
                at=utc_now(),
                pid=os.getpid(),
                host=self._host,
            )
            return int(n)

        return self._write(write)

    def test_looks(self) -> list[TestLook]:
        rows = self._rows("SELECT * FROM test_looks ORDER BY look_number")
        return [
            TestLook(
                r["look_number"], r["run_id"], json.loads(r["config"]), r["config_hash"], r["at"]
            )
            for r in rows
        ]

    def record_evaluation(
        self,
        run_id: str,
        split: str,
        metrics: Mapping[str, Any],
        *,
        eval_config_hash: str,
        data_version: str,
        update: int | None = None,
        predictions: Iterable[Prediction | Mapping[str, Any]] = (),
        test_look: int | None = None,
    ) -> int:
        """Store one evaluation (run id or BASELINE) with its per-example predictions; returns
        its id. A test-split evaluation must name the look counted for it (H4)."""
        if split not in SPLITS:
            raise input_error("split", repr(split), f"use one of: {', '.join(SPLITS)}")
        if (split == "test") != (test_look is not None):
            raise input_error(
                "test_look",
                repr(test_look),
                "a test evaluation needs its look from record_test_look; no other does",
            )
        for key, value in (("eval_config_hash", eval_config_hash), ("data_version", data_version)):
            if not value:
                raise input_error(key, "empty", "record how and on what it was evaluated (V2)")
        preds = [_prediction(p, i) for i, p in enumerate(predictions)]
        seen: set[str] = set()
        for p in preds:
            if str(p.example_id) in seen:
                raise input_error(
                    "predictions", f"example id {p.example_id!r} twice", "give one row per example"
                )
            seen.add(str(p.example_id))
        metrics_json = dumps(dict(metrics), "metrics")
        pred_rows = [
            (
                str(p.example_id),
                dumps(p.gold, "gold"),
                dumps(p.pred, "pred"),
                None if p.score is None else float(p.score),
                dumps(dict(p.row), "row"),
            )
            for p in preds
        ]

        def write(conn: sqlite3.Connection) -> int:
            self._require_run(conn, run_id, baseline_ok=True)
            if test_look is not None:
                sql = "SELECT 1 FROM test_looks WHERE look_number = ? AND run_id = ?"
                if not conn.execute(sql, (test_look, run_id)).fetchone():
                    raise input_error("test_look", str(test_look), f"record a look for {run_id}")
            eid = insert(
                conn,
                "evaluations",
                run_id=run_id,
                split=split,
                at_update=update,
                metrics=metrics_json,
                eval_config_hash=eval_config_hash,
                data_version=data_version,
                test_look=test_look,
                at=utc_now(),
            )
            sql = "INSERT INTO predictions VALUES (?, ?, ?, ?, ?, ?)"
            conn.executemany(sql, [(eid, *row) for row in pred_rows])
            return eid

        return self._write(write)

    def evaluations(self, run_id: str | None = None, split: str | None = None) -> list[Evaluation]:
        """Evaluations in the order recorded, optionally of one run (or BASELINE) / one split."""
        rows = self._rows(
            """SELECT e.*, (SELECT count(*) FROM predictions p WHERE p.evaluation_id = e.id) AS n
               FROM evaluations e WHERE (?1 IS NULL OR run_id = ?1) AND (?2 IS NULL OR split = ?2)
               ORDER BY id""",
            (run_id, split),
        )
        return [
            Evaluation(
                r["id"],
                r["run_id"],
                r["split"],
                r["at_update"],
                json.loads(r["metrics"]),
                r["eval_config_hash"],
                r["data_version"],
                r["test_look"],
                r["at"],
                r["n"],
            )
            for r in rows
        ]

    def predictions(self, evaluation_id: int) -> list[Prediction]:
        """The per-example rows of one evaluation, in the order they were given."""
        if not self._rows("SELECT 1 FROM evaluations WHERE id = ?", (evaluation_id,)):
            raise input_error("evaluation", str(evaluation_id), "use an id from evaluations()")
        rows = self._rows(
            "SELECT * FROM predictions WHERE evaluation_id = ? ORDER BY rowid", (evaluation_id,)
        )
        return [
            Prediction(
                r["example_id"],
                json.loads(r["gold"]),
                json.loads(r["pred"]),
                r["score"],
                json.loads(r["row"]),
            )
            for r in rows
        ]

    # -- notebook (L4) -----------------------------------------------------------------------
    def add_note(self, text: str, run_id: str | None = None) -> int:
        """A decision or an observation, timestamped, optionally about one run."""
        if not text or not text.strip():
            raise input_error("note", "empty text", "write the decision or observation")

        def write(conn: sqlite3.Connection) -> int:
            if run_id is not None:
                self._require_run(conn, run_id)
            sql = "INSERT INTO notebook (at, run_id, text) VALUES (?, ?, ?)"
            return int(conn.execute(sql, (utc_now(), run_id, text.strip())).lastrowid or 0)

        return self._write(write)

    def notes(self, run_id: str | None = None) -> list[Note]:
        rows = self._rows(
            "SELECT * FROM notebook WHERE ?1 IS NULL OR run_id = ?1 ORDER BY id", (run_id,)
        )
        return [Note(r["id"], r["at"], r["run_id"], r["text"]) for r in rows]

    # -- hypothesis (H1, H2) -----------------------------------------------------------------
    def fix_hypothesis(self, body: Mapping[str, Any], reason: str | None = None) -> str:
        """Fix the hypothesis and guards (at the first baseline) and return its hash.

        The same body again is a no-op. A different body is an amendment and needs a reason;
        the original stays, so the report can show it next to the amended one.
        """
        from tunepilot.campaign.schema import stable_hash

        body_json, digest = dumps(dict(body), "hypothesis"), stable_hash(dict(body))

        def write(conn: sqlite3.Connection) -> str:
            last = conn.execute("SELECT hash FROM hypothesis ORDER BY id DESC LIMIT 1").fetchone()
            if last is not None and last[0] == digest:
                return digest
            if last is not None and not (reason or "").strip():
                raise input_error(
                    "hypothesis",
                    f"changed since it was fixed (hash {last[0]} -> {digest})",
                    "give the reason for the amendment; the original stays in the ledger (H1)",
                )
            kind = "original" if last is None else "amendment"
            conn.execute(
                "INSERT INTO hypothesis (hash, body, kind, reason, at) VALUES (?,?,?,?,?)",
                (digest, body_json, kind, (reason or "").strip() or None, utc_now()),
            )
            return digest

        return self._write(write)

    def hypothesis_history(self) -> list[HypothesisEntry]:
        """The original hypothesis first, then every amendment with its reason."""
        rows = self._rows("SELECT * FROM hypothesis ORDER BY id")
        return [
            HypothesisEntry(
                r["id"], r["hash"], json.loads(r["body"]), r["kind"], r["reason"], r["at"]
            )
            for r in rows
        ]


def _prediction(p: Prediction | Mapping[str, Any], i: int) -> Prediction:
    if isinstance(p, Prediction):
        return p
    try:
        return Prediction(**p)
    except TypeError:
        raise input_error(
            f"predictions[{i}]", f"keys {sorted(p)}", "give example_id, gold, pred, score, row"
        ) from None
