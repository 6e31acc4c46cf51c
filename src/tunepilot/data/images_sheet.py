"""Pictures for a person to look at (D3, D4, D2): the contact sheet and near-duplicate pairs.

A table of sizes cannot show a centre crop that cuts the digit off, an EXIF rotation applied
in one place and not another, or a transparent background turned black. These PNGs can: each
row is one example, each cell one step of the real pipeline, captioned with what it produced.
Tiny images are enlarged with nearest-neighbour so their pixels stay visible.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

CELL = 112  # pixels per picture cell
CAPTION = 30  # caption lines under a cell
LABEL_WIDTH = 150  # the row label's column
BACKGROUND, INK, FRAME = (255, 255, 255), (20, 20, 20), (200, 200, 200)


@dataclass
class Cell:
    """One picture and the two short lines printed under it."""

    image: Any  # PIL image, any mode
    title: str
    note: str = ""


def tensor_picture(tensor: Any) -> Any:
    """A (channels, height, width) tensor as an RGB picture, each image min-max scaled (the
    processor's normalisation is undone for the eye, not for the model)."""
    from PIL import Image

    values = tensor.detach().float()
    low, high = float(values.min()), float(values.max())
    scaled = (values - low) / (high - low) if high > low else values * 0
    array = (scaled.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    if array.shape[2] == 1:
        array = array[:, :, 0]
    return Image.fromarray(array).convert("RGB")


def _fit(image: Any) -> Any:
    """Scale into a CELL x CELL box keeping the aspect ratio; small images stay pixel-sharp."""
    from PIL import Image

    w, h = image.size
    scale = min(CELL / w, CELL / h)
    new = (max(1, round(w * scale)), max(1, round(h * scale)))
    resample = Image.Resampling.NEAREST if scale >= 1 else Image.Resampling.LANCZOS
    shown = image.convert("RGBA") if image.mode in ("RGBA", "LA", "P") else image.convert("RGB")
    return shown.resize(new, resample)


def draw_rows(rows: list[tuple[str, list[Cell]]], path: Path, title: str) -> Path:
    """Rows of captioned cells into one PNG at `path` (folders created); returns `path`."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default()
    columns = max((len(cells) for _, cells in rows), default=1)
    row_h = CELL + CAPTION + 12
    width = LABEL_WIDTH + columns * (CELL + 10) + 10
    height = 30 + len(rows) * row_h
    sheet = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    draw.text((10, 8), title, fill=INK, font=font)
    checker = _checkerboard()
    for r, (label, cells) in enumerate(rows):
        top = 30 + r * row_h
        for i, line in enumerate(_wrap(label, 22)[:6]):
            draw.text((10, top + 4 + 12 * i), line, fill=INK, font=font)
        for c, cell in enumerate(cells):
            left = LABEL_WIDTH + c * (CELL + 10)
            draw.rectangle((left - 1, top - 1, left + CELL, top + CELL), outline=FRAME)
            shown = _fit(cell.image)
            x, y = left + (CELL - shown.size[0]) // 2, top + (CELL - shown.size[1]) // 2
            if shown.mode == "RGBA":  # transparency shown over a checkerboard, as editors do
                sheet.paste(checker.crop((0, 0, *shown.size)), (x, y))
                sheet.paste(shown, (x, y), shown)
            else:
                sheet.paste(shown, (x, y))
            draw.text((left, top + CELL + 3), cell.title[:20], fill=INK, font=font)
            draw.text((left, top + CELL + 15), cell.note[:20], fill=(90, 90, 90), font=font)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path)
    return path


def write_pairs_sheet(pairs: list[tuple[Any, Any, int, float]], path: Path) -> Path:
    """Near-duplicate pairs side by side (D2): the earlier split's picture on the left."""
    from PIL import Image

    rows = []
    for a, b, bits, diff in pairs:
        cells = []
        for facts in (a, b):
            with Image.open(facts.path) as image:
                image.load()
                cells.append(Cell(image.copy(), facts.split, f"{facts.size[0]}x{facts.size[1]}"))
        rows.append((f"{a.name}\n~ {b.name}\n{bits} bits, diff {diff:.3f}", cells))
    return draw_rows(rows, path, "near-duplicate pairs across splits (left: earlier split)")


def _checkerboard() -> Any:
    from PIL import Image, ImageDraw

    board = Image.new("RGB", (CELL, CELL), (235, 235, 235))
    draw = ImageDraw.Draw(board)
    for y in range(0, CELL, 8):
        for x in range((y // 8) % 2 * 8, CELL, 16):
            draw.rectangle((x, y, x + 7, y + 7), fill=(205, 205, 205))
    return board


def _wrap(text: str, width: int) -> list[str]:
    lines: list[str] = []
    for part in text.split("\n"):
        while len(part) > width:
            lines.append(part[:width])
            part = part[width:]
        lines.append(part)
    return lines
