"""Image classification settings: how files become pixels, and the declared augmentations (D1, D3).

Augmentations are named, parametrised steps (`hflip`, `{random_crop: 0.8}` ...), validated
here so a misspelt name is an error with a did-you-mean, never a silently skipped transform.
They are part of the data version, like cleaning rules: two runs with different augmentations
did not see the same inputs. Importing this module stays cheap (no Pillow, no torch).
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from tunepilot.campaign.bounds import Strict

AUGMENTATIONS: dict[str, str] = {
    "hflip": "mirror left-right with probability 0.5",
    "vflip": "mirror top-bottom with probability 0.5",
    "resize": "{resize: N}: shorter side to N pixels (bicubic), aspect kept",
    "center_crop": "{center_crop: F}: the central F x F fraction of the image (0 < F <= 1)",
    "random_crop": "{random_crop: F}: an F x F fraction at a random position (0 < F <= 1)",
    "rotate": "{rotate: D}: a random angle in [-D, D] degrees",
    "color_jitter": "{color_jitter: S}: brightness, contrast, saturation each x [1-S, 1+S]",
}
_NO_PARAMETER = ("hflip", "vflip")


def _check_augmentation(step: Any) -> str | dict[str, float]:
    """A step is a bare name (`hflip`) or a one-key mapping `{name: number}`."""
    if isinstance(step, str) and step in _NO_PARAMETER:
        return step
    if isinstance(step, dict) and len(step) == 1:
        ((name, value),) = step.items()
        bounds = {
            "center_crop": (0, 1),
            "random_crop": (0, 1),
            "color_jitter": (0, 1),
            "rotate": (0, 180),
            "resize": (1, 100_000),
        }
        if name in bounds and isinstance(value, int | float) and not isinstance(value, bool):
            low, high = bounds[name]
            if low < value <= high:
                return {name: value}
            raise ValueError(f"augmentation {name}: {value} is outside ({low}, {high}]")
    name = step if isinstance(step, str) else next(iter(step), "") if isinstance(step, dict) else ""
    close = difflib.get_close_matches(str(name), list(AUGMENTATIONS), n=1)
    hint = f" (did you mean `{close[0]}`?)" if close else ""
    raise ValueError(
        f"unknown augmentation {step!r}{hint}; use one of: "
        + "; ".join(f"{k} ({v})" for k, v in AUGMENTATIONS.items())
    )


Augmentation = Annotated[Any, AfterValidator(_check_augmentation)]


class ImageSettings(Strict):
    """How image files become model inputs (image_classification only)."""

    augment: list[Augmentation] = Field(
        default_factory=list,
        description="Training-only augmentations in order, drawn from the seed and example id.",
    )
    exif_transpose: bool = Field(
        default=True, description="Apply the EXIF orientation tag before anything else."
    )
    max_pixels: int = Field(
        default=50_000_000,
        ge=1,
        description="Refuse larger images (decompression bombs); Pillow decodes nothing bigger.",
    )
    size_leak_accuracy: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Audit FAIL when size/mode/format alone predict the label this well.",
    )
    near_duplicate_bits: int = Field(
        default=6, ge=0, le=32, description="Perceptual-hash bits near-duplicates may differ by."
    )
    near_duplicate_pixel_diff: float = Field(
        default=0.025,
        ge=0,
        le=1,
        description="...and their mean absolute difference as 16x16 greyscale (0-1) at most: a "
        "resize or re-encode stays under it, two different pictures rarely come this close.",
    )
