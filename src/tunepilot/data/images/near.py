"""Near duplicates across splits (D2): a resized, re-encoded or mirrored copy of a training
picture in evaluation turns the score into a memory test.

A candidate pair is found by perceptual hash (`imagehash.phash`, 64 bits), the second picture
taken as stored and mirrored left-right (a flip is the commonest augmentation, so a flipped copy
is one the model has as good as seen). Hashes alone pair pictures that merely share a layout
(a dark shape on a plain background), so every candidate is confirmed on the pixels: the mean
difference of 16 x 16 thumbnails, in greyscale and, when both pictures have colour, in colour
as well (a yellow and a pink picture with the same layout are not copies). Copies inside one
split are left alone: they weigh double, but score nothing that was trained on.
"""

from __future__ import annotations

from pathlib import Path

from tunepilot.campaign.image_settings import ImageSettings
from tunepilot.data.audit.labels import SHOWN
from tunepilot.data.images.facts import ImageFacts
from tunepilot.tasks.example import SPLITS
from tunepilot.verdict import Finding, Verdict

NearPair = tuple[ImageFacts, ImageFacts, int, float, bool]
"""(earlier split's picture, later split's picture, hash bits apart, pixel difference,
whether the second is a mirrored copy)."""


def pixel_difference(a: ImageFacts, b: ImageFacts, mirrored: bool) -> float:
    """Mean absolute thumbnail difference (0-1): greyscale, and the larger of grey and colour
    when both pictures have colour; `mirrored` compares `a` with `b` flipped left-right."""
    import numpy as np

    def flip(x: np.ndarray) -> np.ndarray:
        return x[:, ::-1] if mirrored else x

    diff = float(np.abs(a.thumb - flip(b.thumb)).mean())
    if a.colour is not None and b.colour is not None:
        diff = max(diff, float(np.abs(a.colour - flip(b.colour)).mean()))
    return diff


def near_pairs(good: list[ImageFacts], settings: ImageSettings) -> list[NearPair]:
    """Pairs in different splits within `near_duplicate_bits` of perceptual hash (as stored or
    mirrored) and `near_duplicate_pixel_diff` of pixels; exact copies are check_exact_images'.
    Hash distances are whole matrices (XOR + popcount), a block of rows at a time: 50,000
    images stay seconds."""
    import numpy as np

    by_split = {s: [f for f in good if f.split == s] for s in SPLITS}
    out: list[NearPair] = []
    for i, first in enumerate(SPLITS):
        for second in SPLITS[i + 1 :]:
            left, right = by_split[first], by_split[second]
            if not left or not right:
                continue
            a = np.array([f.phash for f in left], dtype=np.uint64)
            b = np.array([f.phash for f in right], dtype=np.uint64)
            b_mirror = np.array([f.mirrored_phash for f in right], dtype=np.uint64)
            for start in range(0, len(a), 1024):
                block = a[start : start + 1024, None]
                bits = np.bitwise_count(block ^ b[None, :])
                bits_mirror = np.bitwise_count(block ^ b_mirror[None, :])
                near = (bits <= settings.near_duplicate_bits) | (
                    bits_mirror <= settings.near_duplicate_bits
                )
                for r, c in zip(*np.nonzero(near), strict=True):
                    x, y = left[start + int(r)], right[int(c)]
                    if x.pixels == y.pixels:
                        continue
                    found = _confirmed(x, y, int(bits[r, c]), int(bits_mirror[r, c]), settings)
                    if found is not None:
                        out.append(found)
    return out


def _confirmed(
    x: ImageFacts, y: ImageFacts, bits: int, bits_mirror: int, settings: ImageSettings
) -> NearPair | None:
    """The closer reading of a candidate (as stored, else mirrored) if its pixels agree."""
    limit = settings.near_duplicate_bits
    readings = [(b, m) for b, m in ((bits, False), (bits_mirror, True)) if b <= limit]
    for b, mirrored in readings:
        diff = pixel_difference(x, y, mirrored)
        if diff <= settings.near_duplicate_pixel_diff:
            return x, y, b, diff, mirrored
    return None


def check_near_images(
    good: list[ImageFacts], settings: ImageSettings, folder: Path | None
) -> Finding:
    """D2: FAIL naming each pair across splits, drawn side by side for a person to judge."""
    check = "near duplicate images across splits"
    pairs = near_pairs(good, settings)
    rule = (
        f"perceptual hash within {settings.near_duplicate_bits} bits, as stored or mirrored, "
        f"and mean pixel difference <= {settings.near_duplicate_pixel_diff:g}"
    )
    if not pairs:
        return Finding(check, Verdict.PASS, f"no near-duplicate pair across splits ({rule})", "D2")
    picture = None
    if folder is not None:
        from tunepilot.data.images.sheet import write_pairs_sheet

        picture = write_pairs_sheet(
            pairs[:12], Path(folder) / "near_duplicates.png", settings.max_pixels,
            settings.exif_transpose,
        )  # fmt: skip
    shown = "; ".join(
        f"{a.name} ({a.split}) ~ {b.name} ({b.split}{', mirrored' if m else ''})"
        for a, b, _, _, m in pairs[:SHOWN]
    )
    more = f" and {len(pairs) - SHOWN} more" if len(pairs) > SHOWN else ""
    where = f"; side by side in {picture}" if picture else ""
    sentence = (
        f"{len(pairs)} near-duplicate pair(s) across splits ({rule}), e.g. {shown}{more}"
        f"{where}; keep each picture and its resized, re-encoded or mirrored copies in one "
        "split (a group field, split.policy: group) or delete the copies"
    )
    details = {
        "pairs": [
            {
                "a": a.name,
                "a_split": a.split,
                "b": b.name,
                "b_split": b.split,
                "hash_bits": bits,
                "pixel_diff": round(diff, 4),
                "mirrored": mirrored,
            }
            for a, b, bits, diff, mirrored in pairs[:50]
        ],
        "picture": str(picture) if picture else None,
    }
    ids = [x.example.id for a, b, *_ in pairs[:3] for x in (a, b)][:SHOWN]
    return Finding(check, Verdict.FAIL, sentence, "D2", ids, details)
