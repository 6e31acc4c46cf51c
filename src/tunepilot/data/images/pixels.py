"""What the pixels say about a class beside its content (D2, D3, D8).

File properties (size, mode, format) are one way a source shows through; the pixels are
another. Three checks, each a rule a person can re-check by hand:

* a **frame, border or watermark** that alone identifies a class: for each border statistic
  (the mean and spread of the outermost line and of a strip along each side, of each corner,
  and the border's colour), training images of a class give an interval (5th to 95th
  percentile); a class is *identified* when on the evaluation images that interval finds at
  least `size_leak_accuracy` of the class with at least that precision (the shortcut test of
  `shortcuts.py`, on pixels instead of file properties);
* **greyscale in one split and colour in another** for one class: the share of colour
  pictures of a class differs by SPLIT_GAP between training and an evaluation split;
* a declared **flip or rotation that turns one class into another**: each training image of a
  class, flipped (or rotated) as the augmentation would, is given the class of its nearest
  unflipped training images (16 x 16 greyscale, k = NEIGHBOURS), when it sits as close to that
  class as the class's own pictures sit to one another (their 75th percentile): when most of
  a class become another class that its unflipped images rarely resemble, the augmentation
  trains the model on mislabelled pictures (a mirrored `b` is a `d`). A flipped picture that
  merely resembles nothing (a slanted `1` mirrored) is not counted.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from tunepilot.campaign.image_settings import ImageSettings
from tunepilot.data.audit.labels import SHOWN
from tunepilot.data.images.facts import ImageFacts
from tunepilot.data.images.shortcuts import MIN_CLASS_SUPPORT
from tunepilot.verdict import Finding, Verdict

PASS, WARN, FAIL = Verdict.PASS, Verdict.WARN, Verdict.FAIL
SPLIT_GAP = 0.5  # shares of colour pictures of one class this far apart: another source
STRIP = 0.08  # of each side: the strip a frame or a watermark band lives in
CORNER = 0.15  # of each side: the corner patch a logo or a stamp lives in
NEIGHBOURS = 5
PER_CLASS = 100  # training images per class the flip check reads
FLIP_SHARE = 0.5  # of a class's flipped images taking another class: the flip relabels it
_SIDES = ("top", "bottom", "left", "right")


def border_stats(image: Any) -> dict[str, float]:
    """The border statistics of one decoded RGB image, each in [0, 1]."""
    import numpy as np

    rgb = np.asarray(image, dtype=np.float32) / 255.0
    grey = rgb.mean(axis=2)
    h, w = grey.shape
    sh, sw = max(1, round(STRIP * h)), max(1, round(STRIP * w))
    ch, cw = max(1, round(CORNER * h)), max(1, round(CORNER * w))
    regions = {
        "top line": grey[:1], "bottom line": grey[-1:], "left line": grey[:, :1],
        "right line": grey[:, -1:], "top strip": grey[:sh], "bottom strip": grey[-sh:],
        "left strip": grey[:, :sw], "right strip": grey[:, -sw:],
        "top-left corner": grey[:ch, :cw], "top-right corner": grey[:ch, -cw:],
        "bottom-left corner": grey[-ch:, :cw], "bottom-right corner": grey[-ch:, -cw:],
    }  # fmt: skip
    out: dict[str, float] = {}
    for name, region in regions.items():
        out[f"{name} brightness"] = float(region.mean())
        out[f"{name} spread"] = float(region.std())
    ring = np.concatenate([rgb[:sh].reshape(-1, 3), rgb[-sh:].reshape(-1, 3),
                           rgb[:, :sw].reshape(-1, 3), rgb[:, -sw:].reshape(-1, 3)])  # fmt: skip
    for i, channel in enumerate(("red", "green", "blue")):
        out[f"border {channel}"] = float(ring[:, i].mean())
    return out


def _identified(
    train: list[ImageFacts], held: list[ImageFacts], feature: str, threshold: float
) -> list[tuple[str, float, float, float, float]]:
    """(class, low, high, recall, precision) for each class the feature's interval finds."""
    import numpy as np

    values: dict[str, list[float]] = defaultdict(list)
    for f in train:
        values[str(f.example.label)].append(f.border[feature])
    gold = [str(f.example.label) for f in held]
    seen = np.array([f.border[feature] for f in held])
    out = []
    for label, xs in values.items():
        support = gold.count(label)
        if support < MIN_CLASS_SUPPORT or support / len(held) >= threshold:
            continue
        low, high = np.quantile(xs, [0.05, 0.95])
        inside = (seen >= low - 0.01) & (seen <= high + 0.01)
        right = sum(1 for g, i in zip(gold, inside, strict=True) if i and g == label)
        chosen = int(inside.sum())
        if chosen and right / support >= threshold and right / chosen >= threshold:
            out.append((label, float(low), float(high), right / support, right / chosen))
    return out


def check_border_shortcuts(good: list[ImageFacts], settings: ImageSettings) -> Finding:
    """D2/D8: a frame, border or watermark strip that alone identifies a class."""
    check = "class identified by its border"
    train = [f for f in good if f.split == "train" and f.border]
    held = [f for f in good if f.split != "train" and f.border]
    if not train or not held:
        sentence = ("cannot validate: the rule is learned on training images and judged on "
                    "evaluation images, and one of the two is empty")
        return Finding(check, WARN, sentence, "D2")
    threshold = settings.size_leak_accuracy
    hits: dict[str, tuple[str, float, float, float, float]] = {}
    for feature in train[0].border:
        for found in _identified(train, held, feature, threshold):
            label = found[0]
            if label not in hits or found[3] + found[4] > hits[label][3] + hits[label][4]:
                hits[label] = (feature, *found[1:])  # type: ignore[assignment]
    details = {"threshold": threshold, "identified": [
        {"class": c, "statistic": s, "interval": [round(lo, 3), round(hi, 3)],
         "recall": round(r, 4), "precision": round(p, 4)}
        for c, (s, lo, hi, r, p) in sorted(hits.items())]}  # fmt: skip
    if not hits:
        sentence = (
            "no border statistic (edge lines, side strips, corners, border colour) identifies "
            f"a class on the evaluation images (rule: a class's training interval finding "
            f"{threshold:.0%} of it at {threshold:.0%} precision)"
        )
        return Finding(check, PASS, sentence, "D2, D8", details=details)
    parts = []
    ids = []
    for label, (stat, low, high, recall, precision) in sorted(hits.items())[:4]:
        files = [f for f in held if str(f.example.label) == label][:2]
        ids += [f.example.id for f in files]
        parts.append(f"the {stat} of class {label} lies in [{low:.2f}, {high:.2f}] and finds "
                     f"{recall:.0%} of its evaluation images at {precision:.0%} precision "
                     f"(e.g. {', '.join(f.name for f in files)})")  # fmt: skip
    sentence = (
        f"{'; '.join(parts)}: a frame, border or watermark strip tells the class without the "
        "picture, and the model learns it first; crop or remove it from every image (or add "
        "images of that class without it)"
    )
    return Finding(check, FAIL, sentence, "D2, D8", ids[:SHOWN], details)


def check_colour_per_split(good: list[ImageFacts]) -> Finding:
    """D3/D8: one class greyscale in one split and colour in another (judged on pixels)."""
    check = "colour and greyscale per class and split"
    per: dict[str, dict[str, list[ImageFacts]]] = defaultdict(lambda: defaultdict(list))
    for f in good:
        per[str(f.example.label)][f.split].append(f)
    differ = []
    for label, splits in sorted(per.items()):
        share = {s: sum(f.colour is not None for f in fs) / len(fs) for s, fs in splits.items()
                 if len(fs) >= MIN_CLASS_SUPPORT}  # fmt: skip
        if "train" not in share:
            continue
        for split, value in share.items():
            if split != "train" and abs(value - share["train"]) >= SPLIT_GAP:
                colour_in = "train" if share["train"] > value else split
                grey_in = split if colour_in == "train" else "train"
                example = [next(f for f in splits[colour_in] if f.colour is not None),
                           next(f for f in splits[grey_in] if f.colour is None)]  # fmt: skip
                differ.append((label, split, share["train"], value, example))
    colour = sum(f.colour is not None for f in good)
    if not differ:
        sentence = (f"{colour} of {len(good)} pictures are in colour, in like shares in every "
                    "split of each class")  # fmt: skip
        return Finding(check, PASS, sentence, "D3, D8")
    shown = "; ".join(
        f"class {label}: {a:.0%} colour in train, {b:.0%} in {split} (e.g. {ex[0].name} "
        f"in colour, {ex[1].name} grey)" for label, split, a, b, ex in differ[:4]
    )
    sentence = (
        f"{shown}: the splits of a class come from different sources, so evaluation measures "
        "colour, not the class; convert every split the same way (all greyscale, or colour "
        "from the originals)"
    )
    ids = [f.example.id for *_, ex in differ[:3] for f in ex][:SHOWN]
    details = {"differ": [{"class": c, "split": s, "train_colour_share": round(a, 4),
                           "split_colour_share": round(b, 4)} for c, s, a, b, _ in differ[:50]]}
    return Finding(check, FAIL, sentence, "D3, D8", ids, details)


def _transforms(augment: list[Any]) -> dict[str, Any]:
    """The declared augmentations that can turn a picture into another class's picture, as
    thumbnail operations: mirrors, and rotations by a quarter turn or more."""
    import numpy as np

    out: dict[str, Any] = {}
    for step in augment:
        name, value = (step, None) if isinstance(step, str) else next(iter(step.items()))
        if name == "hflip":
            out["hflip"] = lambda x: x[:, ::-1]
        elif name == "vflip":
            out["vflip"] = lambda x: x[::-1, :]
        elif name == "rotate" and value is not None and value >= 90:
            for quarter in range(1, int(value // 90) + 1):
                for sign in (1, -1):
                    k = quarter * sign % 4
                    out[f"rotate {k * 90} deg"] = lambda x, k=k: np.rot90(x, k)
    return out


def check_flip_confusion(good: list[ImageFacts], settings: ImageSettings) -> Finding:
    """D3: a declared flip or rotation under which one class looks like another."""
    import numpy as np

    check = "augmentation keeps each class itself"
    transforms = _transforms(list(settings.augment))
    if not transforms:
        return Finding(check, PASS, "no flip or quarter-turn rotation declared "
                       "(data.images.augment)", "D3")  # fmt: skip
    by_class: dict[str, list[ImageFacts]] = defaultdict(list)
    for f in good:
        if f.split == "train" and f.thumb is not None:
            by_class[str(f.example.label)].append(f)
    chosen = [f for fs in by_class.values() for f in fs[:PER_CLASS]]
    if len(by_class) < 2:
        return Finding(check, PASS, "one class only: nothing to confuse", "D3")
    labels = np.array([str(f.example.label) for f in chosen])
    base = np.stack([f.thumb.ravel() for f in chosen])

    def distances(queries: Any, leave_out: bool) -> Any:
        dist = ((queries**2).sum(axis=1)[:, None] + (base**2).sum(axis=1)[None, :]
                - 2 * queries @ base.T).clip(min=0)  # fmt: skip
        if leave_out:
            np.fill_diagonal(dist, np.inf)
        return dist

    def votes(dist: Any) -> list[str]:
        nearest = np.argsort(dist, axis=1)[:, :NEIGHBOURS]
        return [Counter(labels[row].tolist()).most_common(1)[0][0] for row in nearest]

    plain_dist = distances(base, leave_out=True)
    plain = votes(plain_dist)
    # how close a class's pictures sit to one another: a transformed picture "is" another
    # class only as close to it as that class's own pictures are (not merely least far)
    own = {c: float(np.quantile([plain_dist[i][labels == c].min() for i in np.flatnonzero(
        labels == c)], 0.75)) for c in by_class if (labels == c).sum() > 1}  # fmt: skip
    found = []
    for name, fn in transforms.items():
        dist = distances(np.stack([fn(f.thumb).ravel() for f in chosen]), leave_out=False)
        voted = votes(dist)
        for label in sorted(by_class):
            rows = [i for i, x in enumerate(labels) if x == label]
            if len(rows) < MIN_CLASS_SUPPORT:
                continue
            became = Counter(voted[i] for i in rows
                             if voted[i] != label and voted[i] in own
                             and dist[i][labels == voted[i]].min() <= own[voted[i]])  # fmt: skip
            if not became:
                continue
            other, n = became.most_common(1)[0]
            before = sum(plain[i] == other for i in rows) / len(rows)
            if n / len(rows) >= FLIP_SHARE and before < FLIP_SHARE / 2:
                files = [chosen[i] for i in rows[:2]]
                found.append((name, label, other, n / len(rows), before, files))
    if not found:
        sentence = (
            f"{', '.join(transforms)}: every class's transformed training images stay nearest "
            f"to their own class ({NEIGHBOURS} nearest 16 x 16 thumbnails)"
        )
        return Finding(check, PASS, sentence, "D3")
    shown = "; ".join(
        f"{name} turns class {a} into class {b}: {share:.0%} of its transformed training images "
        f"are nearest to {b} (untransformed: {before:.0%}; e.g. {files[0].name})"
        for name, a, b, share, before, files in found[:4]
    )
    sentence = (
        f"{shown}: training then shows pictures of {found[0][2]} labelled {found[0][1]}; remove "
        f"{found[0][0]} from data.images.augment (the classes are not symmetric under it)"
    )
    details = {"confused": [{"augmentation": n, "class": a, "looks_like": b,
                             "share": round(s, 4), "untransformed_share": round(p, 4)}
                            for n, a, b, s, p, _ in found]}  # fmt: skip
    ids = [f.example.id for *_, files in found[:3] for f in files][:SHOWN]
    return Finding(check, FAIL, sentence, "D3", ids, details)
