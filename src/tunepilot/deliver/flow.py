"""`tunepilot export`: the command body over the bundle writer (export.py).

Exit codes follow the README's one rule for outcomes: a bundle whose run fails its guards is
written as asked, says so at the top of its README and in metrics.json, and the command warns
and exits 1.
"""

from __future__ import annotations

import json
from pathlib import Path

from tunepilot.data.workspace import Workspace
from tunepilot.deliver.card import GUARD_NOTE
from tunepilot.deliver.export import export_run
from tunepilot.deliver.provenance import pin_export


def export_command(
    ws: Workspace, run_id: str, out: Path | None, as_json: bool, merge: bool = False
) -> int:
    """Body of `tunepilot export RUN [CAMPAIGN] [--out DIR] [--merge] [--json]`."""
    from tunepilot.console import console, error_console, print_json

    folder = export_run(ws, run_id, out, merge)
    manifest = json.loads((folder / "MANIFEST.json").read_text(encoding="utf-8"))
    fails = json.loads((folder / "metrics.json").read_text("utf-8"))["metrics"]["fails_guards"]
    pin = pin_export(ws, run_id, folder)  # MANIFEST.json's sha256, kept in the ledger
    if as_json:
        print_json({"run_id": run_id, "bundle": str(folder), "files": manifest["files"],
                    "fails_guards": fails, "manifest_sha256": pin})  # fmt: skip
    else:
        console.print(
            f"exported {run_id} to [bold]{folder}[/] ({len(manifest['files'])} files, "
            f"sha256 in MANIFEST.json, whose own sha256 {pin} is kept in the ledger); check "
            f"it with `tunepilot verify {folder} --expect {pin}`", soft_wrap=True, highlight=False
        )
    if fails:  # delivered as asked, but a check failed: say it, and exit 1 (README)
        error_console.print(f"[bold red]warning:[/] {run_id} fails its guards (H2): "
                            f"{'; '.join(fails)}. {GUARD_NOTE}", highlight=False)  # fmt: skip
    return 1 if fails else 0
