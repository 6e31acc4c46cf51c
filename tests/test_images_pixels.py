"""The image audit reads pixels, not only file properties (D2, D3, D6, D8): a cropped copy
across splits, a frame or watermark that tells one class, a class grey in one split and colour
in another, a preprocessor that hands the model 0..255, a declared flip that turns one class
into another, the same picture under two labels. Each is planted in scikit-learn's digits and
caught by file; the same digits without it pass (no alarm)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("imagehash")

CAMPAIGN = """
name: digits-pixels
hypothesis: {behaviour: "Recognise the digit.", task: image_classification}
model: {name_or_path: base-model, method: lora,
        lora: {target_modules: [q_proj, v_proj], modules_to_save: [classifier]}}
data:
  files: {train: data/train, validation: data/validation}
  images: {augment: AUGMENT}
"""


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Clean digits, 30 per class: the first 20 of each class for training, 10 to validate."""
    from tunepilot.demo.images import write_digit_folders

    folder = tmp_path_factory.mktemp("digits")
    every = write_digit_folders(folder / "all", per_class=30, planted=False)
    for label_dir in sorted(every.iterdir()):
        for n, path in enumerate(sorted(label_dir.iterdir())):
            split = "train" if n < 20 else "validation"
            target = folder / "data" / split / label_dir.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    shutil.rmtree(every)
    return folder


def campaign(digits: Path, tmp_path: Path, augment: str = "[]", model: bool = False) -> Path:
    shutil.copytree(digits / "data", tmp_path / "data")
    if model:
        from tunepilot.model.tiny import build_tiny_vit

        build_tiny_vit(tmp_path / "base-model")
    (tmp_path / "campaign.yaml").write_text(CAMPAIGN.replace("AUGMENT", augment))
    return tmp_path / "campaign.yaml"


def audit(path: Path, with_model: bool = False) -> dict:
    from tunepilot.data.flow import audit_findings
    from tunepilot.data.workspace import Workspace

    _, findings = audit_findings(Workspace.open(path), with_tokenizer=with_model)
    return {f.check: f for f in findings}


def files(root: Path, split: str, label: str) -> list[Path]:
    return sorted((root / "data" / split / label).iterdir())


PIXEL_CHECKS = ("cropped copies across splits", "class identified by its border",
                "colour and greyscale per class and split", "augmentation keeps each class itself",
                "conflicting labels", "label spellings")  # fmt: skip


def test_d2_d8_clean_digits_pass_every_pixel_check(digits: Path, tmp_path: Path) -> None:
    found = audit(campaign(digits, tmp_path))
    for check in PIXEL_CHECKS:
        assert found[check].verdict == "PASS", (check, found[check].sentence)


def test_d2_a_cropped_copy_of_a_training_digit_in_validation_fails_naming_both(
    digits: Path, tmp_path: Path
) -> None:
    from PIL import Image

    path = campaign(digits, tmp_path)
    planted = []
    for label, (box, scale) in zip("258", [((1, 1, 7, 7), 1), ((0, 2, 6, 8), 4),
                                          ((2, 0, 8, 6), 3)], strict=True):  # fmt: skip
        source = files(tmp_path, "train", label)[0]
        with Image.open(source) as image:
            crop = image.crop(box)  # 6 x 6 of the 8 x 8 digit, as is or enlarged
            crop = crop.resize((6 * scale, 6 * scale), Image.Resampling.BICUBIC)
            name = tmp_path / "data" / "validation" / label / f"{source.stem}-cropped.png"
            crop.save(name)
        planted.append((source.name, name.name))
    found = audit(path)["cropped copies across splits"]
    assert found.verdict == "FAIL", found.sentence
    pairs = {(Path(p["picture"]).name, Path(p["crop"]).name) for p in found.details["pairs"]}
    assert pairs == set(planted), pairs  # each one, and nothing else
    assert "-cropped.png (validation) is 75% x 75% of" in found.sentence


def test_d2_d8_a_frame_or_a_watermark_that_tells_one_class_fails(
    digits: Path, tmp_path: Path
) -> None:
    import numpy as np
    from PIL import Image

    path = campaign(digits, tmp_path)
    for split in ("train", "validation"):
        for file in files(tmp_path, split, "3"):  # a scanner that frames its pages
            pixels = np.asarray(Image.open(file)).copy()
            pixels[0, :] = pixels[-1, :] = pixels[:, 0] = pixels[:, -1] = 90
            Image.fromarray(pixels).save(file)
    found = audit(path)["class identified by its border"]
    assert found.verdict == "FAIL", found.sentence
    assert [x["class"] for x in found.details["identified"]] == ["3"]
    assert "data/validation/3/" in found.sentence


def test_d3_d8_one_class_grey_in_training_and_colour_in_validation_fails(
    digits: Path, tmp_path: Path
) -> None:
    from PIL import Image, ImageOps

    path = campaign(digits, tmp_path)
    for file in files(tmp_path, "validation", "6"):  # another source: colour scans
        with Image.open(file) as image:
            ImageOps.colorize(image.convert("L"), black="darkblue", white="khaki").save(file)
    found = audit(path)
    colour = found["colour and greyscale per class and split"]
    assert colour.verdict == "FAIL", colour.sentence
    assert "class 6: 0% colour in train, 100% in validation" in colour.sentence


def test_d3_hflip_that_turns_one_class_into_another_fails_a_symmetric_one_passes(
    digits: Path, tmp_path: Path
) -> None:
    """`left` and `right` are one stroke drawn each way (the digits 7 and their mirror): a
    declared hflip relabels every picture it flips. Digits 0, 1 and 8 look like themselves
    mirrored: the same hflip passes."""
    from PIL import Image, ImageOps

    path = campaign(digits, tmp_path, augment="[hflip]")
    for split in ("train", "validation"):
        root = tmp_path / "data" / split
        for label in [p.name for p in root.iterdir()]:
            if label not in ("0", "1", "8", "7"):
                shutil.rmtree(root / label)
        (root / "7").rename(root / "left")
        (root / "right").mkdir()
        for n, file in enumerate(sorted((root / "left").iterdir())):
            if n % 2:
                with Image.open(file) as image:
                    ImageOps.mirror(image).save(root / "right" / f"m{file.name}")
                file.unlink()
    found = audit(path)["augmentation keeps each class itself"]
    assert found.verdict == "FAIL", found.sentence
    assert {(x["class"], x["looks_like"]) for x in found.details["confused"]} == {
        ("left", "right"), ("right", "left")}
    assert "remove hflip from data.images.augment" in found.sentence
    for split in ("train", "validation"):
        for side in ("left", "right"):
            shutil.rmtree(tmp_path / "data" / split / side)
    symmetric = audit(path)["augmentation keeps each class itself"]
    assert symmetric.verdict == "PASS", symmetric.sentence


def test_d2_d6_the_same_digit_under_two_labels_fails(digits: Path, tmp_path: Path) -> None:
    path = campaign(digits, tmp_path)
    source = files(tmp_path, "train", "1")[0]
    shutil.copy(source, tmp_path / "data" / "validation" / "7" / f"{source.stem}-as-7.png")
    found = audit(path)["conflicting labels"]
    assert found.verdict == "FAIL" and "-as-7.png" in found.sentence, found.sentence


def test_d3_a_preprocessor_that_neither_rescales_nor_normalises_fails(
    digits: Path, tmp_path: Path
) -> None:
    from tunepilot.data.images.processed import check_processed_range
    from tunepilot.data.workspace import Workspace

    def judged() -> object:  # the audit's own check, on the campaign's own encoder
        ws = Workspace.open(path)
        prepared = ws.prepare(write=False)
        return check_processed_range(ws.encoder(prepared.label_names), prepared.splits)

    path = campaign(digits, tmp_path, model=True)
    clean = judged()
    assert clean.verdict == "PASS", clean.sentence
    config_file = tmp_path / "base-model" / "preprocessor_config.json"
    config = json.loads(config_file.read_text())
    config.update(do_rescale=False, do_normalize=False)
    config_file.write_text(json.dumps(config))
    found = judged()
    assert found.verdict == "FAIL", found.sentence
    assert "neither rescales nor normalises" in found.sentence and found.details["max"] > 200
