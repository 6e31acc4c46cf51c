"""What the image audit learns about one file: stored and shown size, mode, format, EXIF
orientation, pixel hash, perceptual hashes (as stored and mirrored) and small thumbnails
(D2, D8). Shared by the audit and its checks, so none imports another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunepilot.tasks.example import Example

THUMB = 16  # side of the thumbnails near duplicates are confirmed on
DETAIL = 64  # side of the greyscale copy cropped copies are searched in
GREY_SPREAD = 0.01  # mean distance of a thumbnail's channels from their mean: below, grey


@dataclass
class ImageFacts:
    """One example's file as the audit sees it; `error` set when it cannot be decoded."""

    example: Example
    split: str
    path: Path
    error: str | None = None
    size: tuple[int, int] = (0, 0)  # as stored in the file
    shown: tuple[int, int] = (0, 0)  # as the model gets it (after the EXIF rotation if applied)
    mode: str = ""
    file_format: str = ""
    orientation: int = 1
    pixels: str = ""  # sha256 of the decoded RGB pixels
    phash: int = 0
    mirrored_phash: int = 0  # of the left-right mirror: a flipped copy is a copy too
    thumb: Any = None  # float32 THUMB x THUMB greyscale in [0, 1]
    colour: Any = None  # float32 THUMB x THUMB x 3 RGB in [0, 1]; None for a grey picture
    detail: Any = None  # uint8 DETAIL x DETAIL greyscale: where a cropped copy is looked for
    border: dict[str, float] = field(default_factory=dict)  # pixels.border_stats

    @property
    def name(self) -> str:
        return self.example.text

    @property
    def portrait(self) -> bool | None:
        """Taller than wide as the model gets it; None for a square picture."""
        w, h = self.shown
        return None if w == h else h > w

    def properties(self) -> dict[str, str]:
        """What could identify a class without looking at the picture."""
        w, h = self.size
        return {
            "size": f"{w}x{h}",
            "mode": self.mode,
            "format": self.file_format,
            "aspect ratio": f"{w / h:.2f}" if h else "?",
            "EXIF orientation": str(self.orientation),
            "colour": "grey" if self.colour is None else "colour",  # by pixels, any mode
        }
