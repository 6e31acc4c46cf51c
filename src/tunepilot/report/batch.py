"""The batch as training builds it, in the dossier (D3): `data/<version>/batch.json`, written
by `tunepilot data show --batch` (experiments/batch_view.py), shown as data.

The file is read, never trusted: every value is escaped, a field of the wrong type shows as
missing, and rows and positions are capped so a long batch keeps the page readable (the file
keeps everything). Nothing here loads a tokenizer or a model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tunepilot.report.elements import e, missing, num, table

ROWS_SHOWN = 16
POSITIONS_SHOWN = 512


def read_batch(path: Path) -> dict[str, Any] | None:
    """batch.json with at most ROWS_SHOWN rows of POSITIONS_SHOWN positions (the counts of
    what was left out kept), or None when absent or not a view."""
    try:
        view = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(view, dict) or not isinstance(view.get("rows"), list):
        return None
    rows = [r for r in view["rows"] if isinstance(r, dict)]
    view["rows_left_out"] = max(0, len(rows) - ROWS_SHOWN)
    view["rows"] = rows[:ROWS_SHOWN]
    for row in view["rows"]:
        tokens = row.get("tokens") if isinstance(row.get("tokens"), list) else []
        row["positions_left_out"] = max(0, len(tokens) - POSITIONS_SHOWN)
        row["tokens"] = [t for t in tokens[:POSITIONS_SHOWN] if isinstance(t, dict)]
    return view


def batch_html(view: Any, command: str) -> str:
    """The microbatch's rows, one collapsible table each; a 'missing' line without the file."""
    html = "<h3>The batch as training builds it (D3)</h3>"
    if not isinstance(view, dict):  # read_batch's output, or None
        return html + missing("no batch.json for this data version", command)
    packed = view.get("layout") == "packed"
    shapes = view.get("tensors") if isinstance(view.get("tensors"), dict) else {}
    said = ", ".join(f"{e(k)} {e('x'.join(map(str, v)) if isinstance(v, list) else v)}"
                     for k, v in shapes.items())  # fmt: skip
    packing = view.get("packing") if isinstance(view.get("packing"), dict) else None
    how = (f"packed into rows of {num(packing.get('row_length'))} tokens "
           f"({e(packing.get('attention'))} attention)" if packing else e(view.get("layout")))
    html += (f"<p>Update 1, microbatch 1 of {num(view.get('microbatches_in_update'))}, {how}: "
             f"{said}; {num(view.get('loss_targets'))} position(s) carry loss. A label marked "
             "· is ignored (no loss); the label at t is predicted from position t-1.</p>")
    for r, row in enumerate(view["rows"]):
        spans = ", ".join(
            f"{e(x.get('id'))} [{num(x.get('start'))}:{num(x.get('end'))})"
            for x in row.get("examples") or [] if isinstance(x, dict)
        )  # fmt: skip
        tokens = row["tokens"]
        body = table(
            ["t", "id", "token", "example" if packed else "mask", "pos", "label"],
            [[num(t), num(tok.get("id")), f"<code>{e(tok.get('token'))}</code>",
              _where(tok, packed), num(tok.get("position")),
              "·" if tok.get("label") is None else f"<strong>{num(tok.get('label'))}</strong>"]
             for t, tok in enumerate(tokens)],
            "compact",
        )  # fmt: skip
        cut = row["positions_left_out"]
        more = f"<p>{num(cut)} more position(s) in batch.json</p>" if cut else ""
        head = (f"row {r}: {spans}; {num(row.get('padding'))} padding, "
                f"{num(row.get('loss_positions'))} with loss")  # fmt: skip
        html += f"<details><summary>{head}</summary>{body}{more}</details>"
    if view["rows_left_out"]:
        html += f"<p>{num(view['rows_left_out'])} more row(s) in batch.json</p>"
    return html


def _where(tok: dict[str, Any], packed: bool) -> str:
    if not packed:
        return num(tok.get("attention"))
    return "pad" if tok.get("example") is None else num(tok.get("example"))
