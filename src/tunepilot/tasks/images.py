"""Image classification: an image file -> the model's pixel_values, one class id (D3, D6).

Preprocessing is the base model's own image processor (`AutoImageProcessor`, saved with the
model), so training sees what the model was pretrained on and what a colleague gets from the
exported bundle. Declared augmentations (data.images.augment) run before it, on the training
split only, each drawn from a generator seeded by (data.split.seed, example id): the same data
version gives the same pixels on any machine, which keeps resume and CPU runs bit-identical.
One augmented view per example is drawn per run (the encodings are built once, like text).

The label mapping is the text classifier's (`ClassificationEncoder`), so names and ids cannot
drift between image and text campaigns (D6).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunepilot.campaign import stable_hash
from tunepilot.campaign.image_settings import ImageSettings
from tunepilot.errors import input_error
from tunepilot.tasks.base import Encoded
from tunepilot.tasks.classification import ClassificationEncoder
from tunepilot.tasks.example import Example
from tunepilot.tasks.image_files import DecodedImage, ImageFileError, open_image


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline as `data show` reports it: its name and what it produced
    (a PIL image before the processor, a tensor after). For a tensor, `black` and `white` are
    the per-channel values a stored 0 and 255 become by this step (the processor's own rescale
    and normalisation), so a picture of it shows what the model gets: a double rescale comes
    out black, not stretched back to look right."""

    name: str
    value: Any
    black: tuple[float, ...] = (0.0,)
    white: tuple[float, ...] = (255.0,)


def _channels(value: Any, n: int) -> tuple[float, ...]:
    values = [float(v) for v in value] if isinstance(value, list | tuple) else [float(value)]
    return tuple(values * n)[:n] if len(values) == 1 else tuple(values)


def _range_after(processor: Any, steps: set[str], n: int) -> tuple[tuple[float, ...], ...]:
    """(black, white) per channel once the processor's `steps` have run."""
    black, white = _channels(0.0, n), _channels(255.0, n)
    if "rescale" in steps:
        factor = float(getattr(processor, "rescale_factor", 1 / 255))
        black, white = tuple(b * factor for b in black), tuple(w * factor for w in white)
    if "normalize" in steps:
        mean = _channels(getattr(processor, "image_mean", 0.0), n)
        std = _channels(getattr(processor, "image_std", 1.0), n)
        black = tuple((b - m) / d for b, m, d in zip(black, mean, std, strict=True))
        white = tuple((w - m) / d for w, m, d in zip(white, mean, std, strict=True))
    return black, white


def _augment_step(step: str | dict[str, float], rng: random.Random) -> tuple[str, Callable]:
    """(label, image -> image) for one declared augmentation; the draw happens here, once."""
    from PIL import Image, ImageEnhance, ImageOps

    name, value = (step, None) if isinstance(step, str) else next(iter(step.items()))
    if name in ("hflip", "vflip"):
        flip = rng.random() < 0.5
        fn = ImageOps.mirror if name == "hflip" else ImageOps.flip
        return f"{name} ({'flipped' if flip else 'kept'})", fn if flip else (lambda im: im)
    assert value is not None
    if name == "resize":

        def resize(im: Any) -> Any:
            scale = value / min(im.size)
            new = (max(1, round(im.size[0] * scale)), max(1, round(im.size[1] * scale)))
            return im.resize(new, Image.Resampling.BICUBIC)

        return f"resize shorter side to {int(value)}", resize
    if name in ("center_crop", "random_crop"):
        fx, fy = (0.5, 0.5) if name == "center_crop" else (rng.random(), rng.random())

        def crop(im: Any) -> Any:
            w, h = im.size
            cw, ch = max(1, round(w * value)), max(1, round(h * value))
            left, top = round((w - cw) * fx), round((h - ch) * fy)
            return im.crop((left, top, left + cw, top + ch))

        return f"{name} {value:g}", crop
    if name == "rotate":
        angle = rng.uniform(-value, value)

        def rotate(im: Any) -> Any:
            # The uncovered corners take the border's most common colour, not black: black
            # corners on a white scan are a feature no test image will have.
            w, h = im.size
            border = [im.getpixel((x, y)) for x in range(w) for y in (0, h - 1)]
            border += [im.getpixel((x, y)) for y in range(h) for x in (0, w - 1)]
            fill = max(set(border), key=border.count)
            return im.rotate(angle, resample=Image.Resampling.BILINEAR, fillcolor=fill)

        return f"rotate {angle:+.1f} deg", rotate
    factors = [rng.uniform(1 - value, 1 + value) for _ in range(3)]

    def jitter(im: Any) -> Any:
        for enhancer, f in zip(
            (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color),
            factors,
            strict=True,
        ):
            im = enhancer(im).enhance(f)
        return im

    shown = ", ".join(f"{f:.2f}" for f in factors)
    return f"color_jitter (brightness, contrast, saturation x {shown})", jitter


def processor_identity(processor: Any) -> dict[str, Any]:
    """What identifies an image processor for the data version (D1): class and settings."""
    settings = {k: v for k, v in processor.to_dict().items() if not k.startswith("_")}
    return {"class": type(processor).__name__, "settings_hash": stable_hash(settings)}


class ImageEncoder(ClassificationEncoder):
    """Encode image examples for an image-classification head with one label mapping."""

    kind = "classification"

    def __init__(
        self,
        processor: Any,
        label_names: list[str],
        settings: ImageSettings,
        root: Path,
        seed: int,
        augment: bool = False,
    ) -> None:
        self._set_labels(label_names)
        self.tokenizer = processor  # the model's preprocessor: saved with exports as is
        self.processor = processor
        self.settings = settings
        self.root = Path(root)
        self.seed = seed
        self.augment = augment
        self.max_length = 0
        self.context_fields: list[str] = []
        self._identity = processor_identity(processor)

    def training_view(self) -> ImageEncoder:
        """The same encoder with the declared augmentations on (training split only)."""
        view = copy.copy(self)
        view.augment = bool(self.settings.augment)
        return view

    def path(self, example: Example) -> Path:
        """Image paths are stored relative to the campaign folder (the data version stays the
        same when the folder moves)."""
        return self.root / example.text

    def decode(self, example: Example) -> DecodedImage:
        try:
            return open_image(
                self.path(example), self.settings.max_pixels, self.settings.exif_transpose
            )
        except ImageFileError as exc:
            raise input_error(
                example.source,
                f"image {exc.path} (example {example.id}): {exc.reason}",
                "replace or remove the file (`tunepilot data audit` lists every bad image)",
                title="unusable image",
            ) from None

    def stages(self, example: Example) -> list[Stage]:
        """Every step in order: decoded file, augmentations, the processor's own steps."""
        out = self._augmented(example)
        image = out[-1].value
        p = self.processor
        # The processor's own code with its later steps switched off: exactly what it does.
        switches = [  # the order transformers' image processors apply them in
            ("do_resize", "resize"),
            ("do_center_crop", "center crop"),
            ("do_rescale", "rescale"),
            ("do_normalize", "normalize"),
        ]
        active = [(flag, name) for flag, name in switches if getattr(p, flag, False)]
        for i, (_flag, name) in enumerate(active):
            off = {later: False for later, _ in active[i + 1 :]}
            value = self._process(image, **off)
            done = {n for _, n in active[: i + 1]}
            black, white = _range_after(p, done, int(value.shape[0]))
            out.append(Stage(f"processor {name}", value, black, white))
        if not active:
            out.append(Stage("processor call", self._process(image)))
        return out

    def _augmented(self, example: Example) -> list[Stage]:
        """The decoded image, then one stage per augmentation when this view augments."""
        image = self.decode(example).image
        exif = "EXIF applied" if self.settings.exif_transpose else "EXIF not applied"
        out = [Stage(f"decoded ({exif}, RGB)", image)]
        if self.augment:
            rng = random.Random(f"tunepilot:augment:{self.seed}:{example.id}")
            for step in self.settings.augment:
                label, fn = _augment_step(step, rng)
                image = fn(image)
                out.append(Stage(label, image))
        return out

    def _process(self, image: Any, **overrides: Any) -> Any:
        return self.processor(images=[image], return_tensors="pt", **overrides)["pixel_values"][0]

    def encode(self, example: Example) -> Encoded:
        """pixel_values from the last stage; labels = [class id]."""
        label = self.label_id(example)
        pixels = self._process(self._augmented(example)[-1].value)
        return Encoded(
            example_id=example.id,
            input_ids=[],
            labels=[label],
            prompt_length=0,
            truncated=False,
            target_truncated=False,
            full_length=0,
            pixel_values=pixels,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "image_classification",
            "processor": self._identity,
            "labels": self.label_names,
            "augment": list(self.settings.augment),
            "exif_transpose": self.settings.exif_transpose,
        }
