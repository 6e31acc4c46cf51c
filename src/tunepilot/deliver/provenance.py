"""Where a bundle came from, recorded on both sides (P2, R3).

In the bundle: `run.json` (the run, its status, checkpoint and data version) and
`trainable.json` (trainable and frozen parameter counts, target modules, extra layers saved
whole). In the ledger: the export as a `run_facts` row with the bundle's folder and its pin,
the sha256 of MANIFEST.json, so a bundle met later can be checked against what was exported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunepilot.data.workspace import Workspace


def bundle_extras(run_info: dict[str, Any], model: Any) -> dict[str, Any]:
    from tunepilot.model.params import trainable_report

    return {"run.json": run_info, "trainable.json": trainable_report(model).to_json()}


def pin_export(ws: Workspace, run_id: str, folder: Path) -> str:
    """Record the export and its MANIFEST digest in the ledger; returns the digest."""
    from tunepilot.deliver.verify import manifest_digest
    from tunepilot.ledger import Ledger

    digest = manifest_digest(folder)
    try:
        where = Path(folder).resolve().relative_to(ws.root.resolve()).as_posix()
    except ValueError:  # --out outside the campaign folder: kept as given
        where = str(folder)
    with Ledger.open(ws.ledger_path) as ledger:
        ledger.record_fact(run_id, "export", {"bundle": where, "manifest_sha256": digest})
    return digest
