"""`data show` for images (D3, D4): per class, the file as stored, every transform in order with
what it produced, and a contact sheet PNG of before and after for a person to look at.

Every stage comes from the encoder's own `stages` (the decoding, the declared augmentations
when the training split is shown, then the model's image processor step by step), so what is
shown is exactly what is trained. The sheet is written next to the data version
(`data/<version>/contact_sheet.png`, `contact_sheet-validation.png` for another split) and
the HTML report embeds the training split's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunepilot.data.images.sheet import Cell, draw_rows, tensor_picture
from tunepilot.data.inspect import pick_examples
from tunepilot.tasks.example import Example

SHEET = "contact_sheet.png"


def stage_facts(value: Any) -> dict[str, Any]:
    """Shape and value range of one stage's output: a PIL image or a tensor."""
    import numpy as np

    if hasattr(value, "shape"):  # a tensor from the processor
        return {
            "shape": list(value.shape),
            "dtype": str(value.dtype).removeprefix("torch."),
            "min": round(float(value.min()), 4),
            "max": round(float(value.max()), 4),
        }
    array = np.asarray(value)
    return {
        "size": list(value.size),
        "mode": value.mode,
        "min": int(array.min()),
        "max": int(array.max()),
    }


def describe(encoder: Any, example: Example) -> dict[str, Any]:
    """One example: the file as stored, then every stage with its shape and value range."""
    decoded = encoder.decode(example)
    stages = encoder.stages(example)
    return {
        "id": example.id,
        "file": example.text,
        "label": example.label,
        "expected": encoder.expected_target(example),
        "stored": {
            "size": list(decoded.original_size),
            "mode": decoded.original_mode,
            "format": decoded.file_format,
            "exif_orientation": decoded.orientation,
        },
        "stages": [{"name": s.name, **stage_facts(s.value)} for s in stages],
        "_stages": stages,
    }


def _label(size: tuple[int, int] | list[int]) -> str:
    return f"{size[0]}x{size[1]}"


def contact_sheet(samples: list[dict[str, Any]], root: Path, path: Path, title: str) -> Path:
    """One row per example: the stored file (no EXIF applied), then every stage."""
    from PIL import Image

    rows = []
    for s in samples:
        with Image.open(Path(root) / s["file"]) as stored:
            stored.load()
            stored_copy = stored.copy()
        info = s["stored"]
        cells = [Cell(stored_copy, "as stored", f"{_label(info['size'])} {info['mode']}")]
        for stage, facts in zip(s["_stages"], s["stages"], strict=True):
            if hasattr(stage.value, "shape"):
                note = (
                    f"{'x'.join(map(str, facts['shape']))} {facts['min']:.2f}..{facts['max']:.2f}"
                )
                picture = tensor_picture(stage.value, stage.black, stage.white)
                cells.append(Cell(picture, stage.name.split(" (")[0], note))
            else:
                cells.append(Cell(stage.value, stage.name.split(" (")[0], _label(stage.value.size)))
        orientation = info["exif_orientation"]
        exif = f"\nEXIF orientation {orientation}" if orientation != 1 else ""
        rows.append((f"class {s['label']}\n{Path(s['file']).name}{exif}", cells))
    return draw_rows(rows, path, title)


def show_images(
    encoder: Any,
    examples: list[Example],
    split: str,
    root: Path,
    folder: Path | None,
    n: int,
    per_class: int,
) -> tuple[list[dict[str, Any]], Path | None]:
    """Describe the chosen examples and write the contact sheet; returns (samples, sheet)."""
    view = encoder.training_view() if split == "train" else encoder
    picked = pick_examples(examples, n, per_class or 1, encoder.label_names)
    samples = [describe(view, ex) for ex in picked]
    sheet = None
    if folder is not None:
        augment = "with training augmentations" if view.augment else "no augmentation"
        title = f"{split} split, {augment}: as stored -> every step -> model input"
        # The report embeds the training split's sheet: another split's gets its own name
        name = SHEET if split == "train" else SHEET.replace(".png", f"-{split}.png")
        sheet = contact_sheet(samples, root, Path(folder) / name, title)
    return samples, sheet


def samples_json(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.items() if not k.startswith("_")} for s in samples]


def print_image_samples(samples: list[dict[str, Any]], sheet: Path | None, console: Any) -> None:
    from rich.markup import escape

    for s in samples:
        st = s["stored"]
        console.print(
            f"[bold]{escape(s['id'])}[/] class {escape(str(s['label']))} -> {escape(s['expected'])}"
            f"  stored {_label(st['size'])} {st['mode']} {st['format']}, EXIF orientation "
            f"{st['exif_orientation']}",
            highlight=False,
        )
        for i, stage in enumerate(s["stages"], 1):
            if "shape" in stage:
                what = f"tensor {stage['shape']} {stage['dtype']}"
            else:
                what = f"image {_label(stage['size'])} {stage['mode']}"
            console.print(
                f"  {i}. {escape(stage['name'])}: {what}, values {stage['min']}..{stage['max']}",
                highlight=False,
            )
    if sheet is not None:
        console.print(f"contact sheet (before/after, for a person to look at): {sheet}")
