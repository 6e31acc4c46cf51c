"""The ledger (V3, H4, L4): one append-only SQLite file per campaign (`tunepilot.db`, WAL).

    schema.py    tables, triggers that refuse UPDATE and DELETE, row types
    liveness.py  runs whose process is gone are found and marked `interrupted`
    evidence.py  curves, evaluations with per-example predictions, test looks, notes
    decisions.py every decision `compare` reached, with its evidence digest
    store.py     `Ledger`: opening, run ids, status history, retries on a busy file

Importing it costs only sqlite3 and the standard library.
"""

from tunepilot.ledger.store import BASELINE, DB_NAME, Ledger, Prediction

__all__ = ["BASELINE", "DB_NAME", "Ledger", "Prediction"]
