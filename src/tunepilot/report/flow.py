"""`tunepilot report [CAMPAIGN] [--open] [--json]`: write <campaign>/report/index.html (L4, L5).

The report reads the campaign folder and never trains or evaluates anything, so it can be
written at any moment of a campaign (an empty folder gives a dossier that says, section by
section, what is missing and which command fills it) and rewritten after every step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunepilot.data.workspace import Workspace
from tunepilot.errors import write_text_atomic

REPORT_FILE = "index.html"


def write_report(ws: Workspace) -> tuple[Path, dict[str, Any]]:
    """Collect, render and write the dossier atomically; returns (path, collected dict)."""
    from tunepilot.report.collect import collect
    from tunepilot.report.html import render

    data = collect(ws)
    page = render(data)
    path = ws.report_dir / REPORT_FILE
    write_text_atomic(path, page)  # a reader (or a browser reloading) never sees half a page
    return path, data


def open_in_browser(path: Path) -> bool:
    """Open the page with the system browser; False (never an error) when there is none."""
    import webbrowser

    try:
        return bool(webbrowser.open(path.resolve().as_uri()))
    except webbrowser.Error:
        return False


def report_command(ws: Workspace, open_browser: bool, as_json: bool) -> int:
    """Body of `tunepilot report`: write the dossier, print its path (or, with --json, the
    collected dict with the path under `report_path`). Exit 0: a dossier describes failures,
    it does not fail itself."""
    from tunepilot.console import console, print_json

    path, data = write_report(ws)
    if as_json:
        print_json({**data, "report_path": str(path)})
    else:
        fails = sum(x["severity"] == "FAIL" for x in data["limits"])
        warns = sum(x["severity"] == "WARN" for x in data["limits"])
        console.print(f"dossier written: [bold]{path}[/] ({len(data['runs'])} runs, "
                      f"{fails} FAIL and {warns} WARN among the observed limits)",
                      highlight=False)  # fmt: skip
    if open_browser and not open_in_browser(path):
        console.print(f"no browser found here: open {path.resolve().as_uri()} yourself")
    return 0
