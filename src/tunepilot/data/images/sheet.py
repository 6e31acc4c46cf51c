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

CELL = 120  # pixels per picture cell
CAPTION = 34  # two caption lines under a cell
LABEL_WIDTH = 170  # the row label's column
FONT_SIZE = 12  # Pillow's bundled font: at 10 px its spaces all but vanish
LINE = 15  # pixels per text line
BACKGROUND, INK, FRAME = (255, 255, 255), (20, 20, 20), (200, 200, 200)


@dataclass
class Cell:
    """One picture and the two short lines printed under it."""

    image: Any  # PIL image, any mode
    title: str
    note: str = ""


def tensor_picture(
    tensor: Any, black: tuple[float, ...] = (0.0,), white: tuple[float, ...] = (255.0,)
) -> Any:
    """A (channels, height, width) tensor as an RGB picture, each channel mapped from the value
    a stored 0 becomes (`black`) to the one a stored 255 becomes (`white`): the processor's
    rescale and normalisation are undone exactly, never stretched to fill the range, so a
    picture that is too dark, too bright or rescaled twice looks it."""
    import torch
    from PIL import Image

    values = tensor.detach().float()
    n = values.shape[0]
    low = torch.tensor((black * n)[:n] if len(black) == 1 else black).view(-1, 1, 1)
    high = torch.tensor((white * n)[:n] if len(white) == 1 else white).view(-1, 1, 1)
    scaled = (values - low) / torch.where(high != low, high - low, torch.ones_like(high))
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

    font = ImageFont.load_default(size=FONT_SIZE)
    columns = max((len(cells) for _, cells in rows), default=1)
    row_h = CELL + CAPTION + 14
    width = max(LABEL_WIDTH + columns * (CELL + 10) + 10, int(font.getlength(title)) + 20)
    height = 34 + len(rows) * row_h
    sheet = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    draw.text((10, 9), title, fill=INK, font=font)
    checker = _checkerboard()
    for r, (label, cells) in enumerate(rows):
        top = 34 + r * row_h
        for i, line in enumerate(_wrap(label, LABEL_WIDTH - 16, font)[: row_h // LINE]):
            draw.text((10, top + 2 + LINE * i), line, fill=INK, font=font)
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
            draw.text((left, top + CELL + 4), _fitted(cell.title, CELL + 8, font), fill=INK,
                      font=font)  # fmt: skip
            draw.text((left, top + CELL + 4 + LINE), _fitted(cell.note, CELL + 8, font),
                      fill=(90, 90, 90), font=font)  # fmt: skip
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path)
    return path


def write_pairs_sheet(
    pairs: list[tuple[Any, Any, int, float, bool]], path: Path, max_pixels: int, exif: bool
) -> Path:
    """Near-duplicate pairs side by side (D2): the earlier split's picture on the left, each as
    the model gets it (decoded as training decodes it, EXIF applied when the campaign does)."""
    from tunepilot.tasks.image_files import open_image

    rows = []
    for a, b, bits, diff, mirrored in pairs:
        cells = [
            Cell(open_image(f.path, max_pixels, exif).image, f.split,
                 f"{f.shown[0]}x{f.shown[1]} {f.mode}")
            for f in (a, b)
        ]  # fmt: skip
        how = "mirrored, " if mirrored else ""
        rows.append((f"{a.name}\n~ {b.name}\n{how}{bits} bits, diff {diff:.3f}", cells))
    return draw_rows(rows, path, "near-duplicate pairs across splits (left: the earlier split)")


def _checkerboard() -> Any:
    from PIL import Image, ImageDraw

    board = Image.new("RGB", (CELL, CELL), (235, 235, 235))
    draw = ImageDraw.Draw(board)
    for y in range(0, CELL, 8):
        for x in range((y // 8) % 2 * 8, CELL, 16):
            draw.rectangle((x, y, x + 7, y + 7), fill=(205, 205, 205))
    return board


def _fitted(text: str, width: int, font: Any) -> str:
    """`text` cut to `width` pixels, an ellipsis saying that it was."""
    if font.getlength(text) <= width:
        return text
    while text and font.getlength(text + "...") > width:
        text = text[:-1]
    return text + "..."


def _wrap(text: str, width: int, font: Any) -> list[str]:
    """Lines of at most `width` pixels, broken after a space or a `/` where one is near (a
    path stays readable), else mid-word."""
    lines: list[str] = []
    for part in text.split("\n"):
        while font.getlength(part) > width:
            cut = len(part)
            while cut > 1 and font.getlength(part[:cut]) > width:
                cut -= 1
            breaks = [i + 1 for i, ch in enumerate(part[:cut]) if ch in " /"]
            cut = breaks[-1] if breaks and breaks[-1] > cut // 2 else cut
            lines.append(part[:cut].rstrip())
            part = part[cut:]
        lines.append(part)
    return lines
