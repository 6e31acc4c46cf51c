"""Image campaigns checked on datasets built here with Pillow, not the demo's (D1, D2, D3, S1, L5).

Each planted problem is one a real folder has: a class saved as PNG while the others are
JPEG, a class scanned in greyscale, a copy mirrored or re-encoded at another JPEG quality in
another split, EXIF tags stripped in one split without the pixels being rotated, a table row
whose path climbs out of the data. The clean set (varied sizes, colours, and two pictures with
the same layout in different colours across splits) must pass: a false FAIL costs as much
trust as a missed one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("imagehash")
torch = pytest.importorskip("torch")

CLASSES = ("circle", "square", "triangle")
SPLIT_SIZES = {"train": 12, "validation": 5, "test": 5}
CAMPAIGN = """
name: shapes
hypothesis: {{behaviour: "Name the shape in the picture.", task: image_classification}}
model: {{name_or_path: base-model, method: lora,
        lora: {{r: 4, alpha: 8, target_modules: [q_proj, v_proj], modules_to_save: [classifier]}}}}
data:
  files: {{train: data/train, validation: data/validation, test: data/test}}
  images: {images}
training: {{microbatch: 4, accumulation: 1, budget: {{updates: 2}}, lr: 1.0e-3, eval_every: 2}}
"""


def photo(
    label: str,
    rng: random.Random,
    size: tuple[int, int] | None = None,
    background: tuple[int, int, int] | None = None,
    noise_seed: int | None = None,
) -> Any:
    """A noisy, blurred background with one filled shape: varied like photos, cheap to draw."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter

    w, h = size or (rng.randint(48, 96), rng.randint(48, 96))
    base = np.array(background or [rng.randint(0, 255) for _ in range(3)], dtype=np.float32)
    noise = np.random.default_rng(noise_seed if noise_seed is not None else rng.randint(0, 2**30))
    pixels = base + noise.normal(0, 20, (h, w, 3)) + np.linspace(0, 50, w)[None, :, None]
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    image = image.filter(ImageFilter.GaussianBlur(1))
    draw = ImageDraw.Draw(image)
    r = min(w, h) // 4
    cx, cy = w // 2 + rng.randint(-r // 2, r // 2), h // 2 + rng.randint(-r // 2, r // 2)
    ink = (20, 20, 60)
    if label == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=ink)
    elif label == "square":
        draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=ink)
    else:
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=ink)
    return image


Plant = Callable[[str, str, int, Any], tuple[Any, str]]
"""(split, label, index, image) -> (image to save, extension): how a file is stored."""


def as_jpeg(split: str, label: str, i: int, image: Any) -> tuple[Any, str]:
    return image, "jpg"


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tunepilot.model.tiny import build_tiny_vit

    return build_tiny_vit(tmp_path_factory.mktemp("vit"))


def write_shapes(folder: Path, vit: Path, plant: Plant = as_jpeg, images: str = "{}",
                 seed: int = 0) -> dict[str, list[Path]]:  # fmt: skip
    """train/validation/test folders of the three classes, the tiny ViT and campaign.yaml."""
    rng = random.Random(seed)
    written: dict[str, list[Path]] = {}
    for split, count in SPLIT_SIZES.items():
        for label in CLASSES:
            for i in range(count):
                image, ext = plant(split, label, i, photo(label, rng))
                path = folder / "data" / split / label / f"{split[:2]}{i:03d}.{ext}"
                path.parent.mkdir(parents=True, exist_ok=True)
                image.save(path, quality=90) if ext == "jpg" else image.save(path)
                written.setdefault(split, []).append(path)
    shutil.copytree(vit, folder / "base-model", dirs_exist_ok=True)
    (folder / "campaign.yaml").write_text(CAMPAIGN.format(images=images), encoding="utf-8")
    return written


def audit(folder: Path, *overrides: str) -> dict[str, Any]:
    from tunepilot.data.flow import audit_findings
    from tunepilot.data.workspace import Workspace

    _, found = audit_findings(Workspace.open(folder / "campaign.yaml", list(overrides)), False)
    return {f.check: f for f in found}


IMAGE_CHECKS = ("unusable image files", "file format vs extension", "exact duplicate images",
                "near duplicate images across splits", "EXIF orientation",
                "image properties per class", "class identified by a file property")  # fmt: skip


def test_d2_clean_varied_photos_pass_even_two_same_layouts_in_other_colours(
    tmp_path: Path, vit: Path
) -> None:
    """No false positive: the same layout and noise on a yellow and on a pink background
    (equal in greyscale) in two splits are two pictures, not a copy."""
    write_shapes(tmp_path, vit)
    for split, colour in (("train", (215, 205, 40)), ("test", (235, 159, 225))):
        picture = photo("triangle", random.Random(9), (128, 96), colour, noise_seed=3)
        picture.save(tmp_path / "data" / split / "triangle" / f"layout-{split}.jpg", quality=90)
    found = audit(tmp_path)
    for check in IMAGE_CHECKS:
        assert found[check].verdict == "PASS", (check, found[check].sentence)


@pytest.mark.parametrize(
    ("plant", "expected"),
    [
        (lambda s, label, i, im: (im, "png" if label == "circle" else "jpg"),
         "format PNG identifies class circle"),
        (lambda s, label, i, im: (im.convert("L") if label == "square" else im, "jpg"),
         "mode L identifies class square"),
    ],
    ids=["one-class-png", "one-class-greyscale"],
)  # fmt: skip
def test_d3_a_class_stored_in_its_own_format_or_mode_fails_naming_files_and_fix(
    tmp_path: Path, vit: Path, plant: Plant, expected: str
) -> None:
    write_shapes(tmp_path, vit, plant)
    finding = audit(tmp_path)["class identified by a file property"]
    assert finding.verdict == "FAIL"
    assert expected in finding.sentence and "data/validation/" in finding.sentence
    assert "accurate vs majority-class rate" in finding.sentence
    assert "collect or convert every class the same way" in finding.sentence


def test_d2_mirrored_and_reencoded_copies_across_splits_fail_a_pair_in_one_split_not(
    tmp_path: Path, vit: Path
) -> None:
    from PIL import Image, ImageOps

    written = write_shapes(tmp_path, vit)
    train = written["train"]
    folder = tmp_path / "data"
    with Image.open(train[0]) as image:  # circle tr000, mirrored into test
        ImageOps.mirror(image).save(folder / "test/circle/mirror-of-tr000.jpg", quality=90)
    with Image.open(train[13]) as image:  # square tr001, re-encoded at quality 40
        image.save(folder / "validation/square/q40-of-tr001.jpg", quality=40)
    with Image.open(train[2]) as image:  # circle tr002, a copy inside training only
        image.save(folder / "train/circle/q50-of-tr002.jpg", quality=50)
    near = audit(tmp_path)["near duplicate images across splits"]
    assert near.verdict == "FAIL"
    pairs = {(p["a"].rsplit("/", 1)[1], p["b"].rsplit("/", 1)[1], p["mirrored"])
             for p in near.details["pairs"]}  # fmt: skip
    assert pairs == {("tr000.jpg", "mirror-of-tr000.jpg", True),
                     ("tr001.jpg", "q40-of-tr001.jpg", False)}  # fmt: skip
    assert "mirror-of-tr000.jpg (test, mirrored)" in near.sentence
    assert "delete the copies" in near.sentence and "near_duplicates.png" in near.sentence


def _exif_plant(strip_in_test: bool) -> Plant:
    """Camera files: pixels stored sideways with EXIF orientation 6 (portrait once applied).
    In test, a tool removed the tag and either rotated the pixels upright or did not."""
    from PIL import Image

    def plant(split: str, label: str, i: int, image: Any) -> tuple[Any, str]:
        upright = image.resize((60, 90))
        stored = upright.transpose(Image.Transpose.ROTATE_90)
        if split == "test":
            return (stored if strip_in_test else upright), "jpg"
        exif = Image.Exif()
        exif[274] = 6
        stored.info["exif"] = exif.tobytes()
        return stored, "jpg"

    return plant


def _save_with_exif(folder: Path) -> None:
    """Pillow's save drops info["exif"] unless passed: write the tags again."""
    from PIL import Image

    for path in folder.rglob("*.jpg"):
        with Image.open(path) as image:
            image.load()
        if "/test/" not in path.as_posix():
            exif = Image.Exif()
            exif[274] = 6
            image.save(path, quality=90, exif=exif)


def test_d3_exif_applied_in_one_split_and_not_another_fails_per_split(
    tmp_path: Path, vit: Path
) -> None:
    stripped, rotated = tmp_path / "stripped", tmp_path / "rotated"
    for folder, strip in ((stripped, True), (rotated, False)):
        write_shapes(folder, vit, _exif_plant(strip))
        _save_with_exif(folder / "data")
    # test's files lost the tag but not the rotation: sideways for good, whatever we apply
    exif = audit(stripped)["EXIF orientation"]
    assert exif.verdict == "FAIL", exif.sentence
    assert "train 36 of 36, validation 15 of 15, test 0 of 15" in exif.sentence
    assert "100% of train's pictures are portrait and 0% of test's" in exif.sentence
    assert "data/test/circle/te000.jpg" in exif.sentence and "re-export" in exif.sentence
    # test's files were rotated upright when the tag was removed: consistent once applied...
    exif = audit(rotated)["EXIF orientation"]
    assert exif.verdict == "WARN" and "prepared differently" in exif.sentence
    # ...and not when the campaign ignores the tags
    exif = audit(rotated, "data.images.exif_transpose=false")["EXIF orientation"]
    assert exif.verdict == "FAIL" and "exif_transpose: true" in exif.sentence


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    return subprocess.run([sys.executable, "-m", "tunepilot.cli", *args], capture_output=True,
                          text=True, env=env, timeout=300, check=False)  # fmt: skip


def test_d1_table_paths_out_of_the_data_or_missing_are_exit_2_naming_the_row(
    tmp_path: Path, vit: Path
) -> None:
    written = write_shapes(tmp_path / "c", vit)
    outside = tmp_path / "elsewhere.jpg"
    shutil.copy(written["test"][0], outside)
    table = tmp_path / "c" / "data" / "table.csv"
    rows = ["path,label"] + [f"{p.relative_to(table.parent).as_posix()},{p.parent.name}"
                             for p in written["train"]]  # fmt: skip
    rows += ["../../elsewhere.jpg,circle", f"{outside},circle", "train/circle/gone.jpg,circle"]
    table.write_text("\n".join(rows) + "\n", encoding="utf-8")
    campaign = tmp_path / "c" / "campaign.yaml"
    text = campaign.read_text(encoding="utf-8").replace(
        "  files: {train: data/train, validation: data/validation, test: data/test}",
        "  file: data/table.csv\n  fields: {image: path, label: label}",
    )
    campaign.write_text(text, encoding="utf-8")
    done = _cli("data", "audit", str(campaign))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    err = " ".join(done.stderr.split())
    assert f"{table}:38: image path `../../elsewhere.jpg` leads out of" in err
    assert f"{table}:39: image path `{outside}` leads out of" in err
    assert f"{table}:40: image `train/circle/gone.jpg` not found" in err
    assert "keep the images under either folder" in err


def test_d3_contact_sheet_shows_the_model_input_through_the_processors_own_numbers(
    tmp_path: Path,
) -> None:
    """Each processor cell maps the tensor back with the processor's own rescale factor, mean
    and std: a dim picture stays dim (a per-image min-max stretch made every processor cell
    look equally bright, hiding what brightness jitter or a dark scan did), and the picture
    of the normalised tensor equals the resized one."""
    import numpy as np
    from PIL import ImageEnhance
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    from tunepilot.campaign.image_settings import ImageSettings
    from tunepilot.data.images.sheet import tensor_picture
    from tunepilot.tasks.example import Example
    from tunepilot.tasks.images import ImageEncoder

    dim = ImageEnhance.Brightness(photo("circle", random.Random(1), (40, 30))).enhance(0.3)
    dim.save(tmp_path / "dim.png")
    example = Example("dim", "dim.png", "dim.png", "circle")
    processor = ViTImageProcessorPil(
        size={"height": 24, "width": 24}, image_mean=[0.2, 0.4, 0.6], image_std=[0.3, 0.2, 0.1]
    )
    encoder = ImageEncoder(processor, ["circle"], ImageSettings(), tmp_path, seed=0)
    stages = encoder.stages(example)
    assert [s.name for s in stages] == [
        "decoded (EXIF applied, RGB)",
        "processor resize",
        "processor rescale",
        "processor normalize",
    ]
    resized = stages[1].value.permute(1, 2, 0).numpy().astype(int)
    assert resized.max() < 120  # the picture really is dim
    for stage in stages[1:]:
        picture = np.asarray(tensor_picture(stage.value, stage.black, stage.white)).astype(int)
        assert np.abs(picture - resized).max() <= 1, stage.name
    ignored = ImageSettings(exif_transpose=False)
    plain = ImageEncoder(processor, ["circle"], ignored, tmp_path, seed=0)
    assert plain.stages(example)[0].name == "decoded (EXIF not applied, RGB)"


def test_s1_dry_run_sizes_an_image_campaign_as_its_step_measures(
    tmp_path: Path, vit: Path
) -> None:
    """`tunepilot size` on an image campaign: pixel batches of the processor's size; the
    prediction equals the real step's tensor bytes for LoRA and for full fine-tuning."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.sizing.dry_run.check import check_steps

    write_shapes(tmp_path, vit)
    done = _cli("size", str(tmp_path / "campaign.yaml"), "--json")
    assert done.returncode == 0, done.stderr
    phases = json.loads(done.stdout)["dry_run"]["phases"]
    assert {p["phase"] for p in phases} >= {"first step", "evaluation", "export"}
    assert phases[0]["inputs"]["image"] == "3x32x32" and "length" not in phases[0]["inputs"]
    for method in ("lora", "full"):
        ws = Workspace.open(tmp_path / "campaign.yaml", [f"model.method={method}"])
        for check in check_steps(ws, microbatch=128, base_dtype="fp32", device="cpu"):
            assert check.verdict == "PASS", (method, check.sentence)
            assert abs(check.error) < 0.01, (method, check.sentence)


@pytest.mark.slow
def test_l5_the_image_demo_runs_every_step_of_the_chain(tmp_path: Path) -> None:
    """`tunepilot demo --task image --quick`: its plan step used to exit 2 (the dry run sized
    text only), which ended the demo before the sweep. Every step now runs, on the folder the
    demo fixed after the planted audit FAILed, and the demo exits 0 with a delivered bundle."""
    done = _cli("demo", str(tmp_path / "demo"), "--task", "image", "--quick")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    out = done.stdout
    for step in ("data audit of the planted problems", "data audit (D1-D8)", "baseline",
                 "pilot", "plan (L1, L3)", "sweep", "compare", "report", "summary"):  # fmt: skip
        assert step in out, step
    assert "microbatch 16 x image 3x32x32" in out  # the plan sized pixel batches
    summary = out[out.index("summary") :]
    assert "the dossier lists no FAIL" in summary and "4. delivered:" in summary
    html = (tmp_path / "demo" / "report" / "index.html").read_text(encoding="utf-8")
    assert html.count('<img src="data:image/png;base64,') >= 1  # the contact sheet


def test_d3_showing_another_split_leaves_the_reports_training_sheet_alone(
    tmp_path: Path, vit: Path
) -> None:
    from tunepilot.data.images.show import show_images
    from tunepilot.data.workspace import Workspace

    write_shapes(tmp_path, vit)
    ws = Workspace.open(tmp_path / "campaign.yaml")
    prepared = ws.prepare(seal=False)
    encoder = ws.encoder(prepared.label_names)
    sheets = {}
    for split in ("train", "validation"):
        examples = prepared.splits[split]
        _, sheets[split] = show_images(encoder, examples, split, ws.root, prepared.folder, 0, 1)
    assert sheets["train"].name == "contact_sheet.png"
    assert sheets["validation"].name == "contact_sheet-validation.png"
    assert sheets["train"].read_bytes() != sheets["validation"].read_bytes()
