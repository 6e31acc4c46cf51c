"""Image classification campaigns (H1, D1, D3, P1-P3, S2, R1): loading, encoding, training.

Real parts only: scikit-learn's bundled UCI digits written as PNG files, a tiny ViT built from
config with its image processor saved, peft LoRA, the real loop.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tunepilot.errors import InputError

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

CAMPAIGN = """
name: digits-test
hypothesis:
  behaviour: "Recognise the digit."
  task: image_classification
model:
  name_or_path: base-model
  method: lora
  lora: {{r: 4, alpha: 8, target_modules: [q_proj, v_proj], modules_to_save: [classifier]}}
data:
  file: {file}
  fields: {fields}
  images: {images}
  split: {{policy: {policy}, validation: 0.2, test: 0.1, seed: 0}}
training:
  microbatch: 4
  accumulation: 2
  budget: {{updates: 4}}
  lr: 1.0e-2
  eval_every: 2
  checkpoint_every: 2
"""


def write_campaign(folder: Path, file: str = "data/digits", fields: str = "{}",
                   images: str = "{}", policy: str = "stratified") -> Path:  # fmt: skip
    path = folder / "campaign.yaml"
    text = CAMPAIGN.format(file=file, fields=fields, images=images, policy=policy)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tunepilot.model.tiny import build_tiny_vit

    return build_tiny_vit(tmp_path_factory.mktemp("tiny-vit"))


@pytest.fixture
def campaign_dir(tmp_path: Path, vit_dir: Path) -> Path:
    """8 clean digits per class as a folder per class, the tiny ViT next to them."""
    from tunepilot.demo.images import write_digit_folders

    write_digit_folders(tmp_path / "data" / "digits", per_class=8, planted=False)
    shutil.copytree(vit_dir, tmp_path / "base-model")
    write_campaign(tmp_path)
    return tmp_path


def open_ws(folder: Path, *overrides: str):
    from tunepilot.data.workspace import Workspace

    return Workspace.open(folder / "campaign.yaml", list(overrides))


def test_h1_image_folder_per_class_loads_and_the_version_hashes_file_bytes(campaign_dir) -> None:
    ws = open_ws(campaign_dir)
    prepared = ws.prepare(write=False)
    examples = [e for split in prepared.splits.values() for e in split]
    assert len(examples) == 80 and prepared.label_names == [str(d) for d in range(10)]
    assert all(len(e.context["image_sha256"]) == 64 for e in examples)
    assert examples[0].text.startswith("data/digits/")  # relative to the campaign folder
    # D1: changing one picture's bytes changes the data version; moving nothing else does.
    victim = campaign_dir / "data" / "digits" / "5" / sorted(
        p.name for p in (campaign_dir / "data" / "digits" / "5").iterdir()
    )[0]
    from PIL import Image

    Image.new("L", (8, 8), 0).save(victim)
    assert open_ws(campaign_dir).prepare(write=False).version != prepared.version


def test_d1_augmentations_are_part_of_the_data_version_and_drawn_from_the_seed(
    campaign_dir,
) -> None:
    plain = open_ws(campaign_dir).prepare(write=False).version
    augmented_ws = open_ws(campaign_dir, "data.images.augment=[hflip, {random_crop: 0.75}]")
    prepared = augmented_ws.prepare(write=False)
    assert prepared.version != plain
    encoder = augmented_ws.encoder(prepared.label_names)
    example = prepared.splits["train"][0]
    train_view = encoder.training_view()
    first, again = train_view.encode(example), train_view.encode(example)
    assert torch.equal(first.pixel_values, again.pixel_values)  # deterministic
    assert not encoder.augment and train_view.augment  # evaluation never augments
    other_seed = open_ws(
        campaign_dir,
        "data.images.augment=[hflip, {random_crop: 0.75}]",
        "data.split.seed=7",
    )
    crops = {
        tuple(s.name for s in v.stages(example))
        for v in (train_view, other_seed.encoder(prepared.label_names).training_view())
    }
    assert all(any("random_crop" in n for n in names) for names in crops)


def test_h1_unknown_augmentation_is_an_error_with_a_did_you_mean(campaign_dir) -> None:
    with pytest.raises(InputError) as err:
        open_ws(campaign_dir, "data.images.augment=[hflp]")
    assert "did you mean `hflip`" in str(err.value.problems)


def test_d3_pixel_values_come_from_the_models_own_image_processor(campaign_dir) -> None:
    from transformers import AutoImageProcessor

    ws = open_ws(campaign_dir)
    prepared = ws.prepare(write=False)
    encoder = ws.encoder(prepared.label_names)
    example = prepared.splits["validation"][0]
    encoded = encoder.encode(example)
    processor = AutoImageProcessor.from_pretrained(str(campaign_dir / "base-model"))
    from PIL import Image

    with Image.open(campaign_dir / example.text) as image:
        expected = processor(images=[image.convert("RGB")], return_tensors="pt")["pixel_values"][0]
    assert encoded.pixel_values.shape == (3, 32, 32)
    assert torch.equal(encoded.pixel_values, expected)
    assert encoded.labels == [prepared.label_names.index(example.label)]
    names = [s.name for s in encoder.stages(example)]
    assert names == [
        "decoded (EXIF applied, RGB)",
        "processor resize",
        "processor rescale",
        "processor normalize",
    ]


def test_h1_a_table_of_paths_loads_relative_to_the_table_with_groups(campaign_dir) -> None:
    rows = []
    for label_dir in sorted((campaign_dir / "data" / "digits").iterdir()):
        for i, file in enumerate(sorted(label_dir.iterdir())):
            rel = file.relative_to(campaign_dir / "data").as_posix()
            rows.append({"path": rel, "digit": label_dir.name, "writer": f"w{i % 4}"})
    (campaign_dir / "data" / "digits.jsonl").write_text(
        "\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8"
    )
    write_campaign(campaign_dir, "data/digits.jsonl",
                   "{image: path, label: digit, group: writer}", policy="group")  # fmt: skip
    prepared = open_ws(campaign_dir).prepare(write=False)
    groups = {s: {e.group for e in exs} for s, exs in prepared.splits.items()}
    assert not groups["train"] & groups["validation"]  # D8 as for text
    assert sum(len(v) for v in prepared.splits.values()) == 80
    # a missing file is a load error naming the table's line
    (campaign_dir / "data" / rows[3]["path"]).unlink()
    with pytest.raises(InputError) as err:
        open_ws(campaign_dir).prepare(write=False)
    assert "digits.jsonl:4" in str(err.value.problems[0].where)


def test_p2_image_lora_trains_the_new_head_and_losses_repeat_bit_for_bit(
    campaign_dir, tmp_path_factory
) -> None:
    from tunepilot.experiments.runner import Session
    from tunepilot.model.params import trainable_report
    from tunepilot.train.loop import train

    ws = open_ws(campaign_dir)
    session = Session(ws)
    encoded = session.encoded(ws.campaign)
    runs = []
    for attempt in range(2):
        model = session.build_model(ws.campaign, seed=0)
        report = trainable_report(model)
        run_dir = tmp_path_factory.mktemp(f"run{attempt}")
        result = train(model, encoded.train, ws.campaign.training, run_dir,
                       kind="classification", pad_id=0, progress=False)  # fmt: skip
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        runs.append([json.loads(x)["loss"] for x in lines])
        assert result.status == "completed" and result.updates == 4
    assert runs[0] == runs[1]
    assert any("classifier" in name for name in report.extra_saved)
    metrics = session.evaluate(model, ws.campaign).metrics
    assert set(metrics["per_class"]) == {str(d) for d in range(10)}


def test_p2_image_lora_without_the_head_in_modules_to_save_is_refused_naming_it(
    campaign_dir,
) -> None:
    from tunepilot.experiments.runner import Session
    from tunepilot.model.build import SetupFailure

    ws = open_ws(campaign_dir, "model.lora.modules_to_save=[]")
    with pytest.raises(SetupFailure) as err:
        Session(ws).build_model(ws.campaign, seed=0)
    assert "classifier" in err.value.finding.sentence
    ws = open_ws(campaign_dir, "model.lora.target_modules=[query, v_proj]")
    with pytest.raises(SetupFailure) as err:
        Session(ws).build_model(ws.campaign, seed=0)
    assert "['query']" in err.value.finding.sentence and "q_proj" in err.value.finding.sentence


def test_s2_image_accumulation_2x4_equals_one_batch_of_8(campaign_dir) -> None:
    from tunepilot.experiments.runner import Session
    from tunepilot.train.batching import collate, count_targets
    from tunepilot.train.loop import backward_update

    ws = open_ws(campaign_dir, "model.method=full")
    session = Session(ws)
    examples = session.encoded(ws.campaign).train[:8]
    grads = []
    for split in ([examples[:4], examples[4:]], [examples]):
        model = session.build_model(ws.campaign, seed=0)
        model.eval()  # no dropout: the two shapes must see the same function
        batches = [collate(mb, "classification", 0) for mb in split]
        assert "pixel_values" in batches[0] and "input_ids" not in batches[0]
        total = sum(count_targets(b, "classification") for b in batches)
        backward_update(model, batches, "classification", total)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], rtol=1e-5, atol=1e-7, msg=name)


def test_d3_data_show_json_lists_every_step_and_writes_the_contact_sheet(campaign_dir) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    cmd = [sys.executable, "-m", "tunepilot.cli", "data", "show",
           str(campaign_dir / "campaign.yaml"), "data.images.augment=[vflip, {rotate: 10}]",
           "--per-class", "1", "--json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    samples = shown["samples"]
    assert len(samples) == 10 and {s["label"] for s in samples} == {str(d) for d in range(10)}
    steps = [s["name"].split(" (")[0].split(" +")[0].split(" -")[0] for s in samples[0]["stages"]]
    assert steps == ["decoded", "vflip", "rotate", "processor resize", "processor rescale",
                     "processor normalize"]  # fmt: skip
    last = samples[0]["stages"][-1]
    assert last["shape"] == [3, 32, 32] and -1.0 <= last["min"] < last["max"] <= 1.0
    assert samples[0]["stored"] == {"size": [8, 8], "mode": "L", "format": "PNG",
                                    "exif_orientation": 1}  # fmt: skip
    sheet = Path(shown["contact_sheet"])
    assert sheet.name == "contact_sheet.png" and sheet.parent.parent.name == "data"
    from PIL import Image

    with Image.open(sheet) as image:  # 10 rows of 7 cells (stored + 6 stages)
        assert image.format == "PNG" and image.size[0] > 7 * 112 and image.size[1] > 10 * 112


def test_d3_a_processors_centre_crop_is_shown_as_its_own_step(tmp_path) -> None:
    """A wide photo resized then centre-cropped loses its sides: `data show` must say so."""
    from PIL import Image
    from transformers import BitImageProcessorPil

    from tunepilot.campaign.image_settings import ImageSettings
    from tunepilot.tasks.example import Example
    from tunepilot.tasks.images import ImageEncoder

    Image.new("RGB", (64, 32), (10, 200, 30)).save(tmp_path / "wide.png")
    processor = BitImageProcessorPil(size={"shortest_edge": 40},
                                     crop_size={"height": 24, "width": 24})  # fmt: skip
    encoder = ImageEncoder(processor, ["a"], ImageSettings(), tmp_path, seed=0)
    example = Example("x", "wide.png", "wide.png", "a")
    stages = encoder.stages(example)
    shapes = [(s.name, tuple(getattr(s.value, "shape", ()))) for s in stages[1:]]
    assert shapes == [("processor resize", (3, 40, 80)), ("processor center crop", (3, 24, 24)),
                      ("processor rescale", (3, 24, 24)), ("processor normalize", (3, 24, 24))]
    assert torch.equal(stages[-1].value, encoder.encode(example).pixel_values)


def test_d1_a_dangling_link_or_a_fifo_in_a_class_folder_is_named_never_skipped(
    tmp_path: Path,
) -> None:
    """They were dropped without a word: the loader promises every file not read is named.
    A FIFO is never opened (a reader would wait for ever); the table names its row too."""
    import os

    from tunepilot.campaign import DataSettings
    from tunepilot.data.images.load import load_images
    from tunepilot.demo.images import write_digit_folders

    digits = tmp_path / "digits"
    write_digit_folders(digits, per_class=2, planted=False)
    (digits / "3" / "gone.png").symlink_to(tmp_path / "deleted.png")
    os.mkfifo(digits / "7" / "pipe.png")
    settings = DataSettings.model_validate({"file": "digits"})
    with pytest.raises(InputError) as err:
        load_images(digits, settings, "image_classification", None, tmp_path)
    found = {p.where: p.found for p in err.value.problems}
    assert found == {
        str(digits / "3" / "gone.png"): f"a dangling symbolic link (to {tmp_path / 'deleted.png'}"
        ", which does not exist): it cannot be read as an image",
        str(digits / "7" / "pipe.png"): "a FIFO (named pipe): it cannot be read as an image",
    }
    table = tmp_path / "images.jsonl"
    table.write_text(json.dumps({"path": "digits/7/pipe.png", "digit": "7"}) + "\n")
    settings = DataSettings.model_validate({"file": "images.jsonl",
                                            "fields": {"image": "path", "label": "digit"}})
    with pytest.raises(InputError) as err:
        load_images(table, settings, "image_classification", None, tmp_path)
    (problem,) = err.value.problems
    assert problem.where == f"{table}:1" and "is a FIFO (named pipe)" in problem.found
