"""The image demo's data: real handwritten digits with the problems real image folders have.

The digits are scikit-learn's bundled copy of the UCI handwritten digits (1,797 images of
8 x 8 pixels, 16 grey levels, 10 classes). They are written as one folder per class, then the
problems the audit must catch are planted, each in files whose names say what they are:

* `7/` is stored at 16 x 16 while every other class is 8 x 8: image size alone identifies a
  class (a camera or source that differs per class);
* `4/` is stored as RGBA: the colour mode alone identifies a class;
* a few images of `3/` store their pixels rotated and carry an EXIF orientation tag
  (`*-exif6.png`), as phone photos do;
* some images are copied byte for byte (`*-copy.png`) or resized (`*-resized.png`): with a
  random split they straddle train and evaluation (exact and near duplicates, D2).

`bad_image_files` writes the files that must never crash anything: an empty file, text named
`.png`, a truncated PNG and a 20000 x 20000 decompression bomb of a few hundred bytes.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunepilot.data.workspace import Workspace

BIG_CLASS, RGBA_CLASS, EXIF_CLASS = "7", "4", "3"


def write_digit_folders(folder: Path, per_class: int | None = None, planted: bool = True) -> Path:
    """Write `folder/<digit>/<index>.png`; `per_class` caps each class (None: all 1,797)."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    folder = Path(folder)
    counts: dict[str, int] = {}
    written: dict[str, list[Path]] = {}
    for index, (pixels, target) in enumerate(zip(digits.images, digits.target, strict=True)):
        label = str(int(target))
        if per_class is not None and counts.get(label, 0) >= per_class:
            continue
        counts[label] = counts.get(label, 0) + 1
        grey = Image.fromarray((255 - pixels * 255 / 16).astype(np.uint8), mode="L")  # ink dark
        path = folder / label / f"{index:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        if planted and label == BIG_CLASS:
            grey = grey.resize((16, 16), Image.Resampling.NEAREST)
        if planted and label == RGBA_CLASS:
            grey = grey.convert("RGBA")
        grey.save(path)
        written.setdefault(label, []).append(path)
    if planted:
        _plant(written)
    return folder


def _plant(written: dict[str, list[Path]]) -> None:
    """EXIF-rotated files, exact copies and resized copies (see the module docstring)."""
    from PIL import Image

    for path in written[EXIF_CLASS][:4]:
        with Image.open(path) as image:
            stored = image.transpose(Image.Transpose.ROTATE_90)  # what the sensor wrote
            exif = Image.Exif()
            exif[274] = 6  # "rotate 90 clockwise to view": undoes the stored rotation
            stored.save(path.with_name(f"{path.stem}-exif6.png"), exif=exif)
        path.unlink()
    for label in ("0", "1", "2"):
        for path in written[label][:3]:
            (path.with_name(f"{path.stem}-copy.png")).write_bytes(path.read_bytes())
        for path in written[label][3:6]:
            with Image.open(path) as image:
                bigger = image.resize((24, 24), Image.Resampling.BICUBIC)
                bigger.save(path.with_name(f"{path.stem}-resized.png"))


def bad_image_files(folder: Path) -> dict[str, Path]:
    """The four files that must give a FAIL or exit 2 naming them, never a traceback."""
    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    empty = folder / "empty.png"
    empty.write_bytes(b"")
    text = folder / "notes-not-an-image.png"
    text.write_text("this is a text file with an image's extension\n", encoding="utf-8")
    whole = folder / "whole.png"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(whole)
    truncated = folder / "truncated.png"
    truncated.write_bytes(whole.read_bytes()[:120])
    whole.unlink()
    bomb = folder / "bomb-20000x20000.png"
    bomb.write_bytes(_png_header_only(20000, 20000))
    return {"empty": empty, "text": text, "truncated": truncated, "bomb": bomb}


def _png_header_only(width: int, height: int) -> bytes:
    """A valid PNG signature and header claiming width x height, with almost no pixel data:
    the shape of a decompression bomb (a decoder that trusts the header allocates it all)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    pixels = zlib.compress(b"\0" * (width + 1))  # one row of the claimed many
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


QUICK_UPDATES = 12


def write_image_campaign(folder: Path, quick: bool = False) -> Path:
    """Write the digit folders (problems planted), a tiny ViT and campaign.yaml into `folder`.

    The control adapts the ViT with LoRA on its attention projections and trains the new head
    (`modules_to_save`); the variant fine-tunes every weight. The ViT is built from config, so
    its weights are random: the comparison says which method learns the digits from scratch,
    not how a pretrained backbone would transfer. `quick` keeps 30 digits per class and 12
    updates per run: a smoke test of the wiring, not a result.
    """
    from tunepilot.campaign.templates import template_text
    from tunepilot.model.tiny import build_tiny_vit

    folder = Path(folder)
    write_digit_folders(folder / "data" / "digits", per_class=30 if quick else None)
    build_tiny_vit(folder / "base-model")
    text = template_text("image_classification").replace("{DIR}", str(folder))
    variant = (
        "  lr-1e-3:\n"
        '    explain: "Half the learning rate: is the control overshooting?"\n'
        "    overrides: {training.lr: 1.0e-3}\n"
    )
    assert variant in text, "the image template's variant changed"
    text = text.replace(
        variant,
        "  full-ft:\n"
        '    explain: "Every weight trains: the backbone is built from config, not pretrained, '
        'so low-rank updates on two projections may not be enough."\n'
        "    overrides: {model.method: full}\n",
    )
    if quick:
        text = text.replace("budget: {updates: 200}", f"budget: {{updates: {QUICK_UPDATES}}}")
        text = text.replace("eval_every: 50", "eval_every: 6").replace(
            "warmup_updates: 10", "warmup_updates: 0"
        )
    path = folder / "campaign.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def fix_digit_folders(ws: Workspace) -> str:
    """What a user does once the audit named the planted problems: export the same scans
    again, one size, one mode, no rotation tags, no copies (`data/digits-fixed`), and point
    `data.file` at it. Returns the sentence the demo prints."""
    fixed = write_digit_folders(ws.root / "data" / "digits-fixed", per_class=_per_class(ws),
                                planted=False)  # fmt: skip
    text = ws.campaign_file.read_text(encoding="utf-8")
    old = "  file: data/digits "
    assert old in text, "the image template's data.file line changed"
    ws.campaign_file.write_text(text.replace(old, "  file: data/digits-fixed ", 1), "utf-8")
    return (f"wrote {fixed}: the same {sum(1 for _ in fixed.rglob('*.png'))} scans at 8 x 8, "
            "greyscale, without EXIF rotations, exact or resized copies; data.file now points "
            "there (the planted folder stays, with its audit, for comparison)")


def _per_class(ws: Workspace) -> int | None:
    """The quick demo keeps 30 scans per class: the fixed export keeps the same count."""
    sizes = [len(list(p.glob("[0-9][0-9][0-9][0-9].png")))
             for p in (ws.root / "data" / "digits").iterdir() if p.is_dir()]  # fmt: skip
    return max(sizes) if sizes and max(sizes) < 100 else None
