"""Image files -> pixels, the one way every step decodes them (D2, D3).

The audit, `data show`, training, evaluation and export all call `open_image`, so a file the
audit passed is decoded the same way in training. What can go wrong with a file is turned
into an `ImageFileError` whose reason names the problem (empty, not an image, truncated, too
large to decode safely) instead of a Pillow traceback. Pillow is imported inside the functions.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIF_ORIENTATION = 274
"""The EXIF tag that tells a viewer to rotate/mirror the stored pixels (values 1-8; 1 = as is)."""


class ImageFileError(Exception):
    """A file that cannot be used as an image; `reason` says why in a sentence."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class DecodedImage:
    """An image as the model will see it (RGB, EXIF orientation applied when asked) and the
    facts about the file the audit and `data show` report."""

    image: Any  # PIL.Image.Image, mode RGB
    original_size: tuple[int, int]  # width, height as stored
    original_mode: str  # "RGB", "L", "RGBA", "P" ...
    file_format: str  # what the bytes are: "PNG", "JPEG" ... (not the extension)
    orientation: int  # EXIF orientation tag, 1 when absent

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size


def open_image(path: Path, max_pixels: int, exif_transpose: bool = True) -> DecodedImage:
    """Decode `path` fully into RGB; raises ImageFileError with the reason it cannot.

    The pixel count is checked from the header before any pixel is decoded: a 20000 x 20000
    PNG of a few hundred bytes would otherwise allocate gigabytes (a decompression bomb).
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise ImageFileError(path, "the file is empty (0 bytes)")
    except OSError as exc:
        raise ImageFileError(path, f"cannot read the file ({exc.strerror})") from None
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(path) as handle:
                width, height = handle.size
                if width * height > max_pixels:
                    raise ImageFileError(path, _too_large(width, height, max_pixels))
                handle.load()  # decode every pixel now: a truncated file fails here
                fmt = handle.format or "unknown"
                mode = handle.mode
                orientation = int(handle.getexif().get(EXIF_ORIENTATION, 1) or 1)
                image = ImageOps.exif_transpose(handle) if exif_transpose else handle.copy()
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise ImageFileError(path, f"a decompression bomb ({exc})") from None
        except UnidentifiedImageError:
            raise ImageFileError(path, "not an image Pillow can read") from None
        except (OSError, SyntaxError, ValueError) as exc:  # Pillow's words for broken data
            raise ImageFileError(path, f"truncated or corrupt image data ({exc})") from None
    return DecodedImage(_rgb(image), (width, height), mode, fmt, orientation)


def _too_large(width: int, height: int, max_pixels: int) -> str:
    return (
        f"{width} x {height} = {width * height:,} pixels, over data.images.max_pixels "
        f"({max_pixels:,}): a decompression bomb or a scan far larger than the model's input"
    )


def _rgb(image: Any) -> Any:
    """RGB the way a reader expects: transparency composited on white, not dropped to black."""
    from PIL import Image

    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def pixel_hash(image: Any) -> str:
    """sha256 of the decoded RGB pixels and their size: equal for the same picture saved as
    PNG or BMP, or with other metadata (exact duplicates, D2)."""
    digest = hashlib.sha256(f"{image.size[0]}x{image.size[1]}".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


def file_hash(path: Path) -> str:
    """sha256 of the file's bytes: what the data version records for an image (D1)."""
    with Path(path).open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
