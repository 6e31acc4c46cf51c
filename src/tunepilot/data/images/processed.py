"""The pixel values the model really gets (D3): scaled as the base model was trained.

A pretrained vision model saw its inputs rescaled (x / 255) and usually normalised
((x - mean) / std): values within a few units of 0. A preprocessor_config.json with
`do_rescale: false` and `do_normalize: false` hands it 0..255, and one that rescales pixels
already in [0, 1] hands it 0..0.004: the loss stays finite and the model learns little, or
slowly, from inputs it was never built for. The check runs the campaign's own encoder (the
base model's image processor) on a few training and evaluation images and reads the range.
"""

from __future__ import annotations

from typing import Any

from tunepilot.data.audit.labels import SHOWN
from tunepilot.errors import InputError
from tunepilot.tasks.example import Example
from tunepilot.verdict import Finding, Verdict

SAMPLE = 8  # images encoded per split
UNSCALED = 10.0  # a value above this was never rescaled (a rescaled, normalised one is < 3)
SQUASHED = 0.05  # a spread below this was rescaled twice (255 -> 1 -> 0.004)


def check_processed_range(encoder: Any, splits: dict[str, list[Example]]) -> Finding:
    """D3: FAIL when the processor hands the model unscaled (0..255) or twice-rescaled pixels."""
    check = "pixel values the model gets"
    low, high, seen = float("inf"), float("-inf"), []
    for examples in splits.values():
        for ex in examples[:SAMPLE]:
            try:
                pixels = encoder.encode(ex).pixel_values
            except InputError:
                continue  # an unusable file is the unusable-files check's FAIL
            low, high = min(low, float(pixels.min())), max(high, float(pixels.max()))
            seen.append(ex.id)
    if not seen:
        return Finding(check, Verdict.WARN, "cannot validate: no image could be encoded", "D3")
    processor = getattr(encoder, "processor", None)
    flags = {k: getattr(processor, k, None) for k in ("do_rescale", "do_normalize")}
    seen_range = f"{low:.3g} to {high:.3g} over {len(seen)} images"
    details = {"min": low, "max": high, "examples": seen[:SHOWN], "processor": flags}
    config = "the model's preprocessor_config.json"
    if high > UNSCALED:
        sentence = (
            f"the model gets pixel values from {seen_range}: the image processor neither "
            f"rescales nor normalises (do_rescale {flags['do_rescale']}, do_normalize "
            f"{flags['do_normalize']} in {config}), while the base was trained on inputs near "
            "0; set do_rescale: true (rescale_factor 1/255) and do_normalize: true with the "
            "base's image_mean and image_std"
        )
        return Finding(check, Verdict.FAIL, sentence, "D3", seen[:SHOWN], details)
    if high - low < SQUASHED:
        sentence = (
            f"the model gets pixel values from {seen_range}: every picture is nearly one "
            f"value, as when pixels already in 0..1 are rescaled by 1/255 again; check "
            f"rescale_factor and do_rescale in {config}"
        )
        return Finding(check, Verdict.FAIL, sentence, "D3", seen[:SHOWN], details)
    sentence = f"the model gets pixel values from {seen_range}: rescaled as the base expects"
    return Finding(check, Verdict.PASS, sentence, "D3", seen[:SHOWN], details)
