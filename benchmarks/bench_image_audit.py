"""What the image audit's pixel checks cost on scikit-learn's 1,797 digits, and what the
cropped-copy search finds there.

    .venv/bin/python benchmarks/bench_image_audit.py [--crops 30] [--seed 0]

`--crops` digits are cropped (60-90% of each side, at a random place) and saved as is or
enlarged 4x (bicubic), next to their originals; the split is random (25% validation, 15%
test), so about half of the crops land in another split than their original. Printed: the
seconds (wall and CPU) of decoding every file and of each check, the crops found across splits
out of those planted there, and the pairs found that are no planted crop (false alarms).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path


def plant(folder: Path, n: int, seed: int) -> set[str]:
    from PIL import Image

    rng = random.Random(seed)
    names = set()
    for path in rng.sample(sorted(folder.glob("*/*.png")), n):
        with Image.open(path) as image:
            w, h = image.size
            s = rng.choice([0.6, 0.7, 0.75, 0.8, 0.9])
            cw, ch = max(2, round(w * s)), max(2, round(h * s))
            left, top = rng.randint(0, w - cw), rng.randint(0, h - ch)
            crop = image.crop((left, top, left + cw, top + ch))
            if rng.random() < 0.5:
                crop = crop.resize((cw * 4, ch * 4), Image.Resampling.BICUBIC)
            out = path.with_name(f"{path.stem}-crop.png")
            crop.save(out)
        names.add(out.name)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--crops", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from tunepilot.campaign import validate_mapping
    from tunepilot.data.images.audit import scan
    from tunepilot.data.images.crops import cropped_pairs
    from tunepilot.data.images.pixels import (
        check_border_shortcuts,
        check_colour_per_split,
        check_flip_confusion,
    )
    from tunepilot.data.prepare import prepare_data
    from tunepilot.demo.images import write_digit_folders

    root = Path(tempfile.mkdtemp(prefix="bench-image-audit-"))
    try:
        write_digit_folders(root / "data" / "digits", planted=False)
        planted = plant(root / "data" / "digits", args.crops, args.seed)
        campaign = validate_mapping({
            "name": "bench", "hypothesis": {"behaviour": "digits", "task": "image_classification"},
            "model": {"name_or_path": "unused"},
            "data": {"file": "data/digits", "images": {"augment": ["hflip"]},
                     "split": {"policy": "random", "validation": 0.25, "test": 0.15}}})  # fmt: skip
        prepared = prepare_data(campaign, root, write=False)
        settings = campaign.data.images

        def timed(name: str, fn, *a):
            wall, cpu = time.perf_counter(), time.process_time()
            out = fn(*a)
            print(f"{name:<34} {time.perf_counter() - wall:7.2f} s wall "
                  f"{time.process_time() - cpu:7.2f} s cpu")  # fmt: skip
            return out

        facts = timed("decode + facts (all files)", scan, prepared, root, settings)
        good = [f for f in facts if f.error is None]
        pairs = timed("cropped copies across splits", cropped_pairs, good, settings)
        timed("border statistic shortcut", check_border_shortcuts, good, settings)
        timed("colour per class and split", check_colour_per_split, good)
        timed("flip keeps each class (hflip)", check_flip_confusion, good, settings)
        split = {Path(f.name).name: f.split for f in good}
        across = {n for n in planted if split[n] != split[n.replace("-crop", "")]}
        found = {Path(p["crop"].name).name for p in pairs} | {Path(p["picture"].name).name
                                                             for p in pairs}  # fmt: skip
        hits = {n for n in across if n in found}
        false = [p for p in pairs if not ({Path(p["crop"].name).name,
                                           Path(p["picture"].name).name} & planted)]  # fmt: skip
        print(f"{len(good)} pictures; planted crops across splits found: {len(hits)} of "
              f"{len(across)} (recall {len(hits) / max(1, len(across)):.0%}); pairs that are "
              f"no planted crop: {len(false)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
