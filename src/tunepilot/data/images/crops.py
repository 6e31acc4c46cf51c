"""Cropped copies across splits (D2): a part of a training picture, cut out (and perhaps
resized), in an evaluation split, or the other way round.

A perceptual hash sees a resized or re-encoded copy, not a crop: the crop moves every edge.
So each picture's greyscale copy (`ImageFacts.detail`, DETAIL x DETAIL) is cut into a grid of
boxes (from MIN_SCALE to 0.9 of the picture per side, at five places across and down, shaped
like the other picture: a crop saved as is or resized evenly keeps its aspect), each box is
summarised by the means of a grid of cells (an integral image makes every box a few array
operations) and compared with every picture of the same class in the other splits whole (a
copy keeps its label): the correlation of the zero-mean cells, 4 x 4 for every box (one matrix
product per block of pictures), then 8 x 8 for the boxes that pass. A picture's best
candidates, ranked by how close their cell shades are, are confirmed on the pixels as decoded:
the crop of the bigger picture moves by whole pixels around the box (a pattern search), is
resized to the other picture's size by each of Pillow's filters, and the copy stands when the
mean difference is within `near_duplicate_pixel_diff`, the bound resized copies are held to.
A crop stretched to another aspect (cut 8 x 6, saved 8 x 8) is not looked for.
"""

from __future__ import annotations

from itertools import product
from typing import Any

from tunepilot.campaign.image_settings import ImageSettings
from tunepilot.data.audit.labels import SHOWN
from tunepilot.data.images.facts import ImageFacts
from tunepilot.verdict import Finding, Verdict

MIN_SCALE = 0.5  # the smallest crop looked for, per side (a quarter of the picture)
SCALES = (0.5, 0.6, 0.7, 0.8, 0.9)
PLACES = (0.0, 0.25, 0.5, 0.75, 1.0)  # share of the margin left of (above) the box
COARSE, CELLS = 4, 8  # cells per side: a cheap first pass, then the finer comparison
COARSE_MATCH, MATCH = 0.9, 0.92  # correlations a candidate needs at each pass
RANK_CELLS = 16  # cells per side of the shade comparison that ranks the candidates
CANDIDATES = 2  # best (picture, box) candidates per picture that get the pixel check
BLOCK = 64  # pictures whose boxes are compared at once (bounds memory)

Box = tuple[float, float, float, float]  # left, top, width, height as shares of the picture


def _boxes(ratio: float) -> list[Box]:
    """Boxes whose shape keeps the cropped picture's aspect: `ratio` is the bigger picture's
    aspect over the smaller one's (a crop saved as is, or resized evenly)."""
    out = []
    for s in SCALES:
        w, h = (s, s * ratio) if ratio <= 1 else (s / ratio, s)
        out += [(px * (1 - w), py * (1 - h), w, h) for px, py in product(PLACES, PLACES)]
    return out


def _integral(details: Any) -> Any:
    """Summed-area tables of DETAIL x DETAIL greyscale copies: (n, side + 1, side + 1)."""
    import numpy as np

    n, side = details.shape[0], details.shape[1]
    integral = np.zeros((n, side + 1, side + 1), dtype=np.float64)
    integral[:, 1:, 1:] = details.astype(np.float64).cumsum(axis=1).cumsum(axis=2)
    return integral


def _cells(integral: Any, pictures: Any, boxes: Any, cells: int, raw: bool = False) -> Any:
    """(pairs, cells * cells): the cell means of box `boxes[i]` (left, top, width, height as
    shares) of picture `pictures[i]`, zero-mean and unit-norm (`raw`: as they are, 0-255)."""
    import numpy as np

    side = integral.shape[1] - 1
    steps = np.arange(cells + 1) / cells
    ramp = np.arange(cells + 1)

    def edges(start: Any, length: Any) -> Any:
        e = np.round((start[:, None] + length[:, None] * steps) * side).astype(np.int64)
        e = np.maximum.accumulate(e - ramp, axis=1) + ramp  # every cell one pixel or more
        return np.minimum(e, side)

    xs, ys = edges(boxes[:, 0], boxes[:, 2]), edges(boxes[:, 1], boxes[:, 3])
    corner = integral[pictures[:, None, None], ys[:, :, None], xs[:, None, :]]
    sums = corner[:, 1:, 1:] - corner[:, :-1, 1:] - corner[:, 1:, :-1] + corner[:, :-1, :-1]
    area = (np.diff(ys)[:, :, None] * np.diff(xs)[:, None, :]).clip(min=1)
    out = (sums / area).reshape(len(pictures), -1).astype(np.float32)
    if raw:
        return out
    out -= out.mean(axis=1, keepdims=True)
    out /= np.linalg.norm(out, axis=1, keepdims=True).clip(min=1e-6)
    return out


class _Pixels:
    """Decoded greyscale pixels of the few pictures a candidate needs, each read once."""

    def __init__(self, settings: ImageSettings) -> None:
        self.settings = settings
        self.cache: dict[str, Any] = {}

    def grey(self, f: ImageFacts) -> Any:
        import numpy as np

        from tunepilot.tasks.image_files import open_image

        if f.name not in self.cache:
            image = open_image(f.path, self.settings.max_pixels, self.settings.exif_transpose)
            self.cache[f.name] = np.asarray(image.image.convert("L"), dtype=np.float32)
        return self.cache[f.name]


FILTERS = ("BILINEAR", "BICUBIC", "NEAREST", "BOX", "LANCZOS")


def _difference(crop: Any, small: Any, enough: float) -> float:
    """Mean pixel difference (0-255) of a crop and a picture of perhaps another size: at the
    smaller size, the bigger one resized by each of Pillow's filters until one reads within
    `enough` (a copy was made with one of them); an enlarged copy is also read back at the
    crop's size. The closest reading counts."""
    import numpy as np
    from PIL import Image

    (ch, cw), (sh, sw) = crop.shape, small.shape
    if (ch, cw) == (sh, sw):
        return float(np.abs(crop - small).mean())
    enlarged = ch * cw < sh * sw
    image = Image.fromarray(crop)  # resized to the copy's size, as the copy was made
    readings = [(image, (sw, sh), small, name) for name in FILTERS]
    if enlarged:  # a crop enlarged into the copy: shrink the copy back too
        readings.append((Image.fromarray(small), (cw, ch), crop, "BOX"))
    best = np.inf
    for n, (image, size, against, name) in enumerate(readings):
        resized = np.asarray(image.resize(size, getattr(Image.Resampling, name)),
                             dtype=np.float32)  # fmt: skip
        best = min(best, float(np.abs(resized - against).mean()))
        if best <= enough or (n == 0 and best > 12 * enough):
            break  # close enough; or so far off under bilinear that no filter brings it in
    return best


def _confirm(big: ImageFacts, small: ImageFacts, box: Box, read: _Pixels,
             limit: float) -> tuple[float, Box]:  # fmt: skip
    """The smallest mean pixel difference (0-255) between `small` and a crop of `big` near
    `box` (`_difference`). The crop moves by whole pixels of the bigger picture: one pixel
    (or 3% of the side) at a time along each of its place and size, while that helps, the
    step halving down to one pixel. A start far off the bound is not searched."""
    a, b = read.grey(big), read.grey(small)
    height, width = a.shape
    left, top, w, h = box
    aspect = h * height / max(1.0, w * width)
    enough = limit * 255 / 4

    def measure(x: int, y: int, cw: int) -> tuple[float, tuple[int, int, int, int]]:
        cw = min(width, max(2, cw))
        ch = min(height, max(2, round(cw * aspect)))
        x, y = min(width - cw, max(0, x)), min(height - ch, max(0, y))
        return _difference(a[y : y + ch, x : x + cw], b, enough), (x, y, cw, ch)

    best = measure(round(left * width), round(top * height), round(w * width))
    if best[0] > 4 * limit * 255:
        return best[0], box
    step = max(1, round(0.03 * max(width, height)))
    while best[0] > enough:
        moved = False
        x, y, cw = best[1][:3]
        for dx, dy, dw in ((step, 0, 0), (-step, 0, 0), (0, step, 0), (0, -step, 0),
                           (0, 0, step), (0, 0, -step)):  # fmt: skip
            found = measure(x + dx, y + dy, cw + dw)
            if found[0] < best[0]:
                best, moved = found, True
        if not moved:
            if step == 1:
                break
            step = max(1, step // 2)
    x, y, cw, ch = best[1]
    return best[0], (x / width, y / height, cw / width, ch / height)


def _aspect(f: ImageFacts) -> float:
    w, h = f.shown
    return round(w / h, 1) if h else 1.0


def _candidates(big: list[ImageFacts], small: list[ImageFacts], ratio: float
                ) -> list[tuple[int, int, Box, float]]:  # fmt: skip
    """(big index, small index, box, -gap): each small picture's closest boxes of the big
    ones: a coarse correlation over every box, the finer one for those that pass it, then
    ranked by the mean difference of their cells (correlation forgives shades, a copy keeps
    them)."""
    import numpy as np

    boxes = _boxes(ratio)
    box_array = np.array(boxes, dtype=np.float64)
    small_sums = _integral(np.stack([f.detail for f in small]))
    everyone = np.arange(len(small))
    entire = np.tile([[0.0, 0.0, 1.0, 1.0]], (len(small), 1))
    whole = {c: _cells(small_sums, everyone, entire, c) for c in (COARSE, CELLS)}
    plain = _cells(small_sums, everyone, entire, RANK_CELLS, raw=True)
    kept: list[Any] = []  # (small, big, box, -gap) per block
    for start in range(0, len(big), BLOCK):
        sums = _integral(np.stack([f.detail for f in big[start : start + BLOCK]]))
        pictures = np.repeat(np.arange(len(sums)), len(boxes))
        tiled = np.tile(box_array, (len(sums), 1))
        coarse = _cells(sums, pictures, tiled, COARSE)
        rows, cols = np.nonzero(whole[COARSE] @ coarse.T >= COARSE_MATCH)
        if not len(rows):
            continue
        wanted, where = np.unique(cols, return_inverse=True)  # only the boxes that passed
        fine = _cells(sums, pictures[wanted], tiled[wanted], CELLS)
        value = (whole[CELLS][rows] * fine[where]).sum(axis=1)
        keep = value >= MATCH
        rows, cols, where = rows[keep], cols[keep], where[keep]
        if not len(rows):
            continue
        shades = _cells(sums, pictures[wanted], tiled[wanted], RANK_CELLS, raw=True)
        gap = np.abs(shades[where] - plain[rows]).mean(axis=1) / 255  # a copy keeps its shades
        b, k = np.divmod(cols, len(boxes))
        kept.append(np.stack([rows, start + b, k, -gap], axis=1))
    if not kept:
        return []
    found = np.concatenate(kept)
    found = found[np.lexsort((-found[:, 3], found[:, 1], found[:, 0]))]
    first = np.ones(len(found), dtype=bool)  # the best box of each (small, big) pair
    first[1:] = (found[1:, 0] != found[:-1, 0]) | (found[1:, 1] != found[:-1, 1])
    found = found[first]
    found = found[np.lexsort((-found[:, 3], found[:, 0]))]  # per small picture, best first
    starts = np.flatnonzero(np.r_[True, found[1:, 0] != found[:-1, 0]])
    rank = np.arange(len(found)) - np.repeat(starts, np.diff(np.r_[starts, len(found)]))
    found = found[rank < CANDIDATES]
    return [(int(b), int(s), boxes[int(k)], float(v)) for s, b, k, v in found]


def cropped_pairs(good: list[ImageFacts], settings: ImageSettings) -> list[dict[str, Any]]:
    """Every (bigger picture, cropped copy) pair whose two pictures sit in different splits."""
    usable = [f for f in good if f.detail is not None and f.thumb is not None]
    limit = settings.near_duplicate_pixel_diff
    read = _Pixels(settings)
    found: dict[frozenset[str], dict[str, Any]] = {}
    groups: dict[tuple[str, str, float], list[ImageFacts]] = {}
    for f in usable:  # a copy keeps its class: pictures are compared within one class
        groups.setdefault((str(f.example.label), f.split, _aspect(f)), []).append(f)
    for (label, big_split, big_aspect), big in sorted(groups.items()):
        for (other, small_split, small_aspect), small in sorted(groups.items()):
            if other != label or small_split == big_split:
                continue
            for i, j, box, value in _candidates(big, small, big_aspect / small_aspect):
                a, b = big[i], small[j]
                key = frozenset((a.example.id, b.example.id))
                if a.pixels == b.pixels or key in found:
                    continue
                diff, refined = _confirm(a, b, box, read, limit)
                diff /= 255
                if diff <= limit and refined[2] * refined[3] < 0.95:  # whole: a near copy
                    found[key] = {"picture": a, "crop": b, "pixel_diff": round(diff, 4),
                                  "box": [round(v, 3) for v in refined],
                                  "match": round(value, 4)}  # fmt: skip
    return list(found.values())


def check_cropped_copies(good: list[ImageFacts], settings: ImageSettings) -> Finding:
    """D2: FAIL naming each cropped copy across splits with the box it was cut from."""
    check = "cropped copies across splits"
    pairs = cropped_pairs(good, settings)
    rule = (f"a box of {MIN_SCALE:.0%} to 90% of a picture's width and height matching another "
            f"split's picture within mean pixel difference {settings.near_duplicate_pixel_diff:g}")
    if not pairs:
        return Finding(check, Verdict.PASS, f"no cropped copy across splits ({rule})", "D2")
    shown = "; ".join(
        f"{p['crop'].name} ({p['crop'].split}) is {p['box'][2]:.0%} x {p['box'][3]:.0%} of "
        f"{p['picture'].name} ({p['picture'].split})" for p in pairs[:SHOWN]
    )
    more = f" and {len(pairs) - SHOWN} more" if len(pairs) > SHOWN else ""
    sentence = (
        f"{len(pairs)} cropped copy pair(s) across splits ({rule}), e.g. {shown}{more}: the "
        "evaluation holds a part of a training picture (or the reverse); keep a picture and its "
        "crops in one split (a group field, split.policy: group) or delete the copies"
    )
    details = {"pairs": [{"picture": p["picture"].name, "picture_split": p["picture"].split,
                          "crop": p["crop"].name, "crop_split": p["crop"].split,
                          "box": p["box"], "pixel_diff": p["pixel_diff"]}
                         for p in pairs[:50]]}  # fmt: skip
    ids = [f.example.id for p in pairs[:3] for f in (p["picture"], p["crop"])][:SHOWN]
    return Finding(check, Verdict.FAIL, sentence, "D2", ids, details)
