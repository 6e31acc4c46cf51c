"""The data version's pictures, embedded in the dossier as data: URIs (D3, D2).

The contact sheet (`data show`, also written by the image audit) and the near-duplicate pairs
are PNG files next to the data version. The dossier is one self-contained file with no script,
so each picture travels inside it, base64-encoded, with its file name as the caption.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from tunepilot.report.elements import e

PICTURES = {
    "contact_sheet.png": "Contact sheet: each class as stored, every transform, the model input",
    "near_duplicates.png": "Near-duplicate pairs across splits (left: the earlier split)",
}
MAX_BYTES = 8 << 20  # a larger picture is linked by path, not embedded


def data_pictures(folder: Path) -> list[dict[str, Any]]:
    """The PNGs present in data/<version>/, each with its data: URI (or None when too large)."""
    out = []
    for name, caption in PICTURES.items():
        path = Path(folder) / name
        if not path.is_file():
            continue
        raw = path.read_bytes()
        uri = None
        if raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) <= MAX_BYTES:
            uri = "data:image/png;base64," + base64.b64encode(raw).decode("ascii")
        out.append({"name": name, "path": str(path), "caption": caption, "data_uri": uri})
    return out


def pictures_html(pictures: list[dict[str, Any]] | None) -> str:
    """<figure>s for the pictures; nothing when the data has none (text campaigns)."""
    html = ""
    for p in pictures or []:
        body = (
            f'<img src="{p["data_uri"]}" alt="{e(p["caption"])}" style="max-width:100%">'
            if p["data_uri"]
            else f"<p>too large to embed: {e(p['path'])}</p>"
        )
        html += (
            f"<figure>{body}<figcaption>{e(p['caption'])} ({e(p['name'])})</figcaption></figure>"
        )
    return html
