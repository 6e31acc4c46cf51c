"""What the image audit learns about one file: decoded size, mode, format, EXIF orientation,
pixel hash, perceptual hash and a small thumbnail (D2, D8). Shared by the audit and its
shortcut check, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunepilot.tasks.example import Example

THUMB = 16  # side of the greyscale thumbnail near duplicates are confirmed on


@dataclass
class ImageFacts:
    """One example's file as the audit sees it; `error` set when it cannot be decoded."""

    example: Example
    split: str
    path: Path
    error: str | None = None
    size: tuple[int, int] = (0, 0)
    mode: str = ""
    file_format: str = ""
    orientation: int = 1
    pixels: str = ""  # sha256 of the decoded RGB pixels
    phash: int = 0
    thumb: Any = None  # float32 THUMB x THUMB greyscale in [0, 1]

    @property
    def name(self) -> str:
        return self.example.text

    def properties(self) -> dict[str, str]:
        """What could identify a class without looking at the picture."""
        w, h = self.size
        return {
            "size": f"{w}x{h}",
            "mode": self.mode,
            "format": self.file_format,
            "aspect ratio": f"{w / h:.2f}" if h else "?",
            "EXIF orientation": str(self.orientation),
        }
