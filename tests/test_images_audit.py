"""The image audit (D2, D3, D8): every planted problem caught, named by file, with the fix;
bad files (empty, text named .png, truncated, a decompression bomb) are a FAIL or exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tunepilot.errors import InputError

pytest.importorskip("sklearn")
pytest.importorskip("imagehash")

CAMPAIGN = """
name: digits-audit
hypothesis: {behaviour: "Recognise the digit.", task: image_classification}
model: {name_or_path: base-model, method: lora,
        lora: {target_modules: [q_proj, v_proj], modules_to_save: [classifier]}}
data:
  file: data/digits
  split: {policy: stratified, validation: 0.25, test: 0.15, seed: 0}
"""


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 digits per class with every planted problem, and the tiny ViT."""
    from tunepilot.demo.images import write_digit_folders
    from tunepilot.model.tiny import build_tiny_vit

    folder = tmp_path_factory.mktemp("planted")
    write_digit_folders(folder / "data" / "digits", per_class=20)
    build_tiny_vit(folder / "base-model")  # the exit-2 check encodes with its processor
    (folder / "campaign.yaml").write_text(CAMPAIGN, encoding="utf-8")
    return folder


def audit(folder: Path) -> dict[str, object]:
    from tunepilot.data.flow import audit_findings
    from tunepilot.data.workspace import Workspace

    _, findings = audit_findings(Workspace.open(folder / "campaign.yaml"))
    return {f.check: f for f in findings}


def test_d2_planted_image_problems_are_each_caught_with_files_and_fix(planted) -> None:
    found = audit(planted)
    size = found["class identified by a file property"]
    assert size.verdict == "FAIL"
    assert "size 16x16 identifies class 7" in size.sentence
    assert "mode RGBA identifies class 4" in size.sentence
    assert "data/digits/7/" in size.sentence and "majority-class rate" in size.sentence
    exact = found["exact duplicate images"]
    near = found["near duplicate images across splits"]
    copies = exact.details["groups"]
    assert copies and all(any(n.endswith("-copy.png") for n in g) for g in copies)
    assert near.verdict == "FAIL" and "-resized.png" in near.sentence
    assert all("resized" in p["a"] + p["b"] for p in near.details["pairs"])  # no stray pair
    picture = Path(near.details["picture"])
    assert picture.is_file() and picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    exif = found["EXIF orientation"]
    assert exif.verdict == "WARN" and "-exif6.png" in exif.sentence
    assert found["image properties per class"].details["modes"] == {"L": 198, "RGBA": 20}


def test_d2_clean_digits_pass_the_image_checks(planted, tmp_path) -> None:
    from tunepilot.demo.images import write_digit_folders

    write_digit_folders(tmp_path / "data" / "digits", per_class=20, planted=False)
    shutil.copytree(planted / "base-model", tmp_path / "base-model")
    (tmp_path / "campaign.yaml").write_text(CAMPAIGN, encoding="utf-8")
    found = audit(tmp_path)
    for check in ("unusable image files", "exact duplicate images", "EXIF orientation",
                  "near duplicate images across splits", "class identified by a file property",
                  "image properties per class"):  # fmt: skip
        assert found[check].verdict == "PASS", found[check].sentence


def test_d3_bad_image_files_fail_the_audit_by_name_and_stop_training_with_exit_2(
    planted, tmp_path
) -> None:
    from tunepilot.demo.images import bad_image_files

    shutil.copytree(planted, tmp_path / "c")
    folder = tmp_path / "c"
    bad = bad_image_files(folder / "data" / "digits" / "5")
    found = audit(folder)["unusable image files"]
    assert found.verdict == "FAIL"
    reasons = {Path(f["file"]).name: f["reason"] for f in found.details["files"]}
    assert reasons["empty.png"] == "the file is empty (0 bytes)"
    assert reasons["notes-not-an-image.png"] == "not an image Pillow can read"
    assert reasons["truncated.png"].startswith("truncated or corrupt")
    assert "decompression bomb" in reasons["bomb-20000x20000.png"]
    assert "400000000 pixels" in reasons["bomb-20000x20000.png"]  # 20000 x 20000

    from tunepilot.data.workspace import Workspace

    ws = Workspace.open(folder / "campaign.yaml")
    prepared = ws.prepare(write=False)
    encoder = ws.encoder(prepared.label_names)
    bomb = next(e for s in prepared.splits.values() for e in s if "bomb" in e.text)
    with pytest.raises(InputError) as err:
        encoder.encode(bomb)
    assert bad["bomb"].name in str(err.value) and "decompression bomb" in str(err.value)

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    cli = [sys.executable, "-m", "tunepilot.cli"]
    done = subprocess.run([*cli, "data", "audit", str(folder / "campaign.yaml"), "--json"],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    verdicts = {f["check"]: f["verdict"] for f in json.loads(done.stdout)["findings"]}
    assert verdicts["unusable image files"] == "FAIL"
