"""The image audit: what makes an image campaign's numbers lie, found before compute (D2, D3, D8).

Every file is decoded once, exactly as training decodes it (`tasks.image_files.open_image`),
and described by a few facts: size, mode, file format, EXIF orientation, a hash of the decoded
pixels and perceptual hashes (`imagehash.phash`). The checks read only those facts:

* unusable files (empty, not an image, truncated, decompression bomb): FAIL naming each file;
* file content that is not what the extension says: WARN;
* exact duplicates by decoded pixels, and near duplicates across splits (`images_near`): a
  perceptual-hash candidate, as stored or mirrored, confirmed by the pixels themselves (a
  resized, re-encoded or flipped copy), shown side by side in
  `data/<version>/near_duplicates.png`;
* EXIF rotations per split: tagged files in one split and none in another FAIL when the tags
  are ignored, or when applying them leaves one split portrait and another landscape (tags
  stripped without rotating); otherwise WARN, named so a person can look at them;
* mixed colour modes, named (each becomes RGB);
* a property that alone identifies a class (all 7s are 16 x 16, all 4s are RGBA, all 3s
  grey among colour pictures): a rule learned on the training split from that property
  alone, scored on the evaluation splits against the majority-class rate. A model learns
  such a shortcut first; FAIL;
* cropped copies across splits (`crops.py`), a frame, border or watermark that identifies a
  class, one class grey in one split and colour in another, a declared flip that turns one
  class into another (`pixels.py`), the same pixels under two labels, two spellings of one
  class; with the model's processor, the pixel values the model gets (`processed.py`).

Group and time splits, unseen labels, class balance and the head's label mapping are the text
audit's own checks, run on the same examples.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from tunepilot.campaign import DataSettings
from tunepilot.campaign.image_settings import ImageSettings
from tunepilot.data.audit.conflicts import (
    Member,
    check_label_spellings,
    conflict_finding,
    conflicting_groups,
)
from tunepilot.data.audit.labels import (
    SHOWN,
    check_class_balance,
    check_label_mapping,
    check_unseen_labels,
)
from tunepilot.data.audit.units import check_group_leakage, check_time_overlap
from tunepilot.data.images.crops import check_cropped_copies
from tunepilot.data.images.facts import DETAIL, GREY_SPREAD, THUMB, ImageFacts
from tunepilot.data.images.near import check_near_images
from tunepilot.data.images.pixels import (
    border_stats,
    check_border_shortcuts,
    check_colour_per_split,
    check_flip_confusion,
)
from tunepilot.data.images.shortcuts import check_shortcuts
from tunepilot.data.prepared import PreparedData
from tunepilot.tasks.example import SPLITS
from tunepilot.tasks.image_files import ImageFileError, open_image, pixel_hash
from tunepilot.verdict import Finding, Verdict

PASS, WARN, FAIL = Verdict.PASS, Verdict.WARN, Verdict.FAIL
SPLIT_GAP = 0.5  # splits whose share of EXIF-tagged files differs this much differ in origin
EXTENSIONS = {
    "PNG": (".png",),
    "JPEG": (".jpg", ".jpeg"),
    "BMP": (".bmp",),
    "GIF": (".gif",),
    "TIFF": (".tif", ".tiff"),
    "WEBP": (".webp",),
}
def scan(prepared: PreparedData, root: Path, settings: ImageSettings) -> list[ImageFacts]:
    """Decode every example once (as training will) and collect its facts."""
    import imagehash
    import numpy as np
    from PIL import Image, ImageOps

    out = []
    for split in SPLITS:
        for ex in prepared.splits.get(split, []):
            facts = ImageFacts(ex, split, Path(root) / ex.text)
            try:
                decoded = open_image(facts.path, settings.max_pixels, settings.exif_transpose)
            except ImageFileError as exc:
                facts.error = exc.reason
                out.append(facts)
                continue
            image = decoded.image
            facts.size, facts.mode = decoded.original_size, decoded.original_mode
            facts.shown = image.size
            facts.file_format, facts.orientation = decoded.file_format, decoded.orientation
            facts.pixels = pixel_hash(image)
            facts.phash = int(str(imagehash.phash(image)), 16)
            facts.mirrored_phash = int(str(imagehash.phash(ImageOps.mirror(image))), 16)
            small = image.resize((THUMB, THUMB), Image.Resampling.BILINEAR)
            facts.thumb = np.asarray(small.convert("L"), dtype=np.float32) / 255.0
            colour = np.asarray(small, dtype=np.float32) / 255.0
            if float(np.abs(colour - colour.mean(axis=2, keepdims=True)).mean()) > GREY_SPREAD:
                facts.colour = colour
            wide = image.resize((DETAIL, DETAIL), Image.Resampling.BILINEAR).convert("L")
            facts.detail = np.asarray(wide, dtype=np.uint8)
            facts.border = border_stats(image)
            out.append(facts)
    return out


def run_image_audit(
    prepared: PreparedData,
    data: DataSettings,
    root: Path,
    model_label_map: dict[int, str] | None = None,
) -> tuple[list[Finding], list[ImageFacts]]:
    """Every image check plus the text audit's split and label checks; returns the facts too
    (the near-duplicate picture and `data show` reuse them)."""
    settings = data.images
    facts = scan(prepared, root, settings)
    good = [f for f in facts if f.error is None]
    splits = prepared.splits
    findings = [
        check_unusable(facts),
        check_extensions(good),
        check_exact_images(good),
        check_near_images(good, settings, prepared.folder),
        check_cropped_copies(good, settings),
        check_exif(good, settings),
        check_modes(good),
        check_shortcuts(good, settings),
        check_border_shortcuts(good, settings),
        check_colour_per_split(good),
        check_flip_confusion(good, settings),
        check_group_leakage(splits, data.fields.group, data.split.policy),
    ]
    if data.fields.time:
        findings.append(check_time_overlap(splits, data.fields.time, data.split.policy,
                                           data.fields.group))  # fmt: skip
    findings += [
        check_label_spellings(splits, data.labels),
        check_conflicting_pictures(good),
        check_unseen_labels(splits),
        check_class_balance(splits, prepared.label_names, data.audit),
    ]
    if model_label_map is not None:
        findings.append(check_label_mapping(model_label_map, prepared.label_names))
    return findings, facts


def _files(items: list[ImageFacts], n: int = SHOWN) -> str:
    return ", ".join(f.name for f in items[:n]) + (
        f" and {len(items) - n} more" if len(items) > n else ""
    )


def check_unusable(facts: list[ImageFacts]) -> Finding:
    """Files training cannot decode: each named with its reason (they would stop a run)."""
    check = "unusable image files"
    bad = [f for f in facts if f.error is not None]
    if not bad:
        return Finding(check, PASS, f"all {len(facts)} image files decode fully", "D3")
    shown = "; ".join(f"{f.name}: {f.error}" for f in bad[:SHOWN])
    more = f"; and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
    sentence = (
        f"{len(bad)} file(s) cannot be used: {shown}{more}; replace or delete them "
        "(training refuses them with exit 2)"
    )
    details = {"files": [{"file": f.name, "split": f.split, "reason": f.error} for f in bad[:50]]}
    return Finding(check, FAIL, sentence, "D3", [f.example.id for f in bad[:SHOWN]], details)


def check_conflicting_pictures(good: list[ImageFacts]) -> Finding:
    """D2/D6: the same pixels under two labels (the text audit's `conflicting labels`)."""
    by_hash: dict[str, list[Member]] = defaultdict(list)
    for f in good:
        by_hash[f.pixels].append(Member(f.split, f.example.id, f.name, str(f.example.label)))
    return conflict_finding(conflicting_groups(list(by_hash.values())), [],
                            "image_classification", "picture")  # fmt: skip


def check_extensions(good: list[ImageFacts]) -> Finding:
    """A PNG named .jpg decodes fine here but not in every tool; worth renaming."""
    check = "file format vs extension"
    wrong = [
        f
        for f in good
        if f.file_format in EXTENSIONS and f.path.suffix.lower() not in EXTENSIONS[f.file_format]
    ]
    if not wrong:
        return Finding(check, PASS, "every file's content matches its extension", "D3")
    shown = ", ".join(f"{f.name} is {f.file_format}" for f in wrong[:SHOWN])
    sentence = (
        f"{len(wrong)} file(s) hold another format than their extension says ({shown}); rename them"
    )
    return Finding(check, WARN, sentence, "D3", [f.example.id for f in wrong[:SHOWN]])


def check_exact_images(good: list[ImageFacts]) -> Finding:
    """D2: the same decoded pixels under two names; across splits it inflates the score."""
    check = "exact duplicate images"
    by_hash: dict[str, list[ImageFacts]] = defaultdict(list)
    for f in good:
        by_hash[f.pixels].append(f)
    groups = [g for g in by_hash.values() if len(g) > 1]
    across = [g for g in groups if len({f.split for f in g}) > 1]
    if not groups:
        return Finding(check, PASS, f"no two of {len(good)} images have the same pixels", "D2")
    pairs = [" = ".join(f"{f.name} ({f.split})" for f in g[:2]) for g in (across or groups)[:3]]
    details = {"groups": [[f.name for f in g] for g in groups[:50]], "across_splits": len(across)}
    ids = [f.example.id for g in (across or groups)[:3] for f in g][:SHOWN]
    verdict, sentence = (
        (FAIL, f"{len(across)} picture(s) appear in more than one split with identical pixels "
         f"(e.g. {'; '.join(pairs)}); delete the copies, keeping one per picture")
        if across
        else (WARN, f"{len(groups)} picture(s) are stored twice inside one split (e.g. "
              f"{'; '.join(pairs)}): they weigh double in training; delete the copies")
    )  # fmt: skip
    return Finding(check, verdict, sentence, "D2", ids, details)


def check_exif(good: list[ImageFacts], settings: ImageSettings) -> Finding:
    """EXIF orientation, per split: a viewer rotates, a loader that ignores the tag does not,
    and a tool that drops the tag without rotating leaves the picture sideways for good.

    Splits whose share of tagged files differs by SPLIT_GAP or more went through different
    pipelines (camera files in one, exported files in another). Without exif_transpose that is
    sideways pictures in one split and upright ones in the other: FAIL. With it, the tagged files
    are turned upright; whether the untagged ones are shows in the shape of the pictures the
    model gets: when one split comes out portrait and the other landscape, the untagged files
    lost their tag without being rotated: FAIL. Otherwise (square pictures say nothing) WARN,
    with each split's counts and the contact sheet to look at."""
    check = "EXIF orientation"
    rotated = [f for f in good if f.orientation != 1]
    if not rotated:
        return Finding(check, PASS, "no file carries an EXIF rotation", "D3")
    splits = {s: [f for f in good if f.split == s] for s in SPLITS}
    splits = {s: items for s, items in splits.items() if items}
    share = {s: sum(f.orientation != 1 for f in items) / len(items) for s, items in splits.items()}
    counts = ", ".join(
        f"{s} {sum(f.orientation != 1 for f in items)} of {len(items)}"
        for s, items in splits.items()
    )
    ids = [f.example.id for f in rotated[:SHOWN]]
    details = {
        "per_split": {s: round(v, 4) for s, v in share.items()},
        "files": [{"file": f.name, "split": f.split, "orientation": f.orientation}
                  for f in rotated[:50]],
    }  # fmt: skip
    tagged, untagged = max(share, key=share.__getitem__), min(share, key=share.__getitem__)

    def judged(verdict: str, sentence: str) -> Finding:
        return Finding(check, verdict, sentence, "D3", ids, details)

    if share[tagged] - share[untagged] < SPLIT_GAP:
        applied = (
            "applied to every split (data.images.exif_transpose: true); look at them in the "
            "contact sheet (`tunepilot data show`)"
            if settings.exif_transpose
            else "NOT applied (data.images.exif_transpose: false): the model sees them rotated; "
            "turn it on unless the stored pixels are what you mean"
        )
        return judged(WARN, f"{len(rotated)} file(s) carry an EXIF rotation "
                      f"({_files(rotated)}; per split: {counts}): {applied}")  # fmt: skip
    seen = (
        f"the splits were prepared differently: files with an EXIF rotation tag per split: "
        f"{counts} (e.g. {_files([f for f in rotated if f.split == tagged], 2)}; untagged in "
        f"{untagged}: {_files([f for f in splits[untagged] if f.orientation == 1], 2)})"
    )
    redo = f"re-export every split the same way from the originals, or rotate {untagged}'s files"
    if not settings.exif_transpose:
        return judged(FAIL, f"{seen}; with data.images.exif_transpose: false the model gets "
                      f"{tagged}'s tagged files as stored (rotated) and {untagged}'s as they are: "
                      f"set exif_transpose: true if the tags are right, else {redo}")  # fmt: skip
    portrait = {s: _portrait_share(items) for s, items in splits.items()}
    details["portrait_share"] = portrait
    a, b = portrait[tagged], portrait[untagged]
    if a is not None and b is not None and abs(a - b) >= SPLIT_GAP:
        return judged(FAIL, f"{seen}; with the tags applied, {a:.0%} of {tagged}'s pictures are "
                      f"portrait and {b:.0%} of {untagged}'s: {untagged}'s files look stripped "
                      "of their tag without being rotated (sideways for good), or the splits "
                      "hold differently shaped pictures; either way evaluation is not what "
                      f"training saw; {redo} (compare `tunepilot data show --split {untagged}` "
                      "with the training split)")  # fmt: skip
    return judged(WARN, f"{seen}; the tags are applied in every split "
                  f"(data.images.exif_transpose: true), so {tagged}'s files come out upright; "
                  f"check with `tunepilot data show --split {untagged}` that {untagged}'s "
                  "untagged files are upright too")  # fmt: skip


def _portrait_share(items: list[ImageFacts]) -> float | None:
    """Share of portrait pictures among the non-square ones (None: all square)."""
    shapes = [f.portrait for f in items if f.portrait is not None]
    return round(sum(shapes) / len(shapes), 4) if shapes else None


def check_modes(good: list[ImageFacts]) -> Finding:
    """Per class: size, aspect ratio, mode and format; mixed modes are named (all become RGB)."""
    check = "image properties per class"
    per_class: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for f in good:
        for prop, value in f.properties().items():
            per_class[str(f.example.label)][prop][value] += 1
    details = {
        label: {p: dict(c.most_common(5)) for p, c in props.items()}
        for label, props in sorted(per_class.items())
    }
    modes = Counter(f.mode for f in good)
    if len(modes) <= 1:
        sentence = (
            f"every image is {next(iter(modes), '?')}; per-class sizes and formats in details"
        )
        return Finding(check, PASS, sentence, "D3", details={"per_class": details})
    minority = [f for f in good if f.mode != modes.most_common(1)[0][0]]
    counts = ", ".join(f"{m} {n}" for m, n in modes.most_common())
    sentence = (
        f"colour modes are mixed ({counts}; e.g. {_files(minority, 3)}): each is converted "
        "to RGB (transparency composited on white) before the processor; check the "
        "contact sheet that they look alike"
    )
    return Finding(
        check,
        WARN,
        sentence,
        "D3",
        [f.example.id for f in minority[:SHOWN]],
        {"per_class": details, "modes": dict(modes)},
    )
