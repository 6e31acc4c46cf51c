"""The campaign file (H1, H2, V1): typed, every problem reported at once with key, line and fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from campaign_support import with_setting
from tunepilot.campaign import load_campaign, validate_mapping
from tunepilot.campaign.checks import check_campaign
from tunepilot.campaign.templates import TASKS, template_text
from tunepilot.campaign.variants import setting_group, variant_campaign, variant_diff
from tunepilot.errors import InputError

MINIMAL = {
    "name": "t",
    "hypothesis": {"behaviour": "route tickets", "task": "classification"},
    "model": {"name_or_path": "minilm"},
    "data": {"file": "data.jsonl", "fields": {"label": "queue"}},
}


def _write(tmp_path: Path, raw: dict | str) -> Path:
    path = tmp_path / "campaign.yaml"
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw, sort_keys=False))
    return path


def _with(key: str, value) -> dict:
    return with_setting(MINIMAL, key, value)


def test_h1_minimal_campaign_gets_defaults_from_the_schema():
    campaign = validate_mapping(MINIMAL)
    assert campaign.training.microbatch == 2 and campaign.training.accumulation == 8
    assert campaign.training.budget.updates == 200
    assert campaign.hypothesis.classification_guards.max_class_drop == 0.05


@pytest.mark.parametrize(
    ("key", "value", "where", "words"),
    [
        ("training.lr", -1, "training.lr", "greater than 0"),
        ("training.lr", "fast", "training.lr", "valid number"),
        ("training.microbatch", 0, "training.microbatch", "greater than or equal to 1"),
        ("model.methd", "lora", "model.methd", "did you mean `method`"),
        ("trainig", {}, "trainig", "did you mean `training`"),
        ("hypothesis.task", "regression", "hypothesis.task", "classification"),
        ("training.precision", "fp8", "training.precision", "fp32"),
        ("training.budget", {"updates": 10, "epochs": 1}, "training.budget", "exactly one"),
        ("data.split", {"policy": "group"}, "data", "data.fields.group"),
        ("data.cleaning", ["nfc", "stirp"], "data.cleaning.1", "did you mean `strip`"),
        ("data.cleaning", [{"max_chars": 0}], "data.cleaning.0", "max_chars"),
        ("hypothesis.classification_guards.max_class_drop", 2, "max_class_drop", "less than"),
        ("data.split", {"validation": 0.5, "test": 0.45}, "data.split", "under 10%"),
        ("variants", {"control": {"explain": "x"}}, "(top level)", "`control`"),
        ("name", "has space", "name", "pattern"),
    ],
)
def test_h1_bad_campaign_values_name_the_key_and_the_fix(tmp_path, key, value, where, words):
    path = _write(tmp_path, _with(key, value))
    with pytest.raises(InputError) as info:
        load_campaign(path)
    text = str(info.value)
    assert where in text, text
    assert words in text, text
    assert "Fix:" in text


def test_h1_all_problems_are_reported_together_with_their_yaml_lines(tmp_path):
    raw = _with("training.lr", -1)
    raw["model"]["methd"] = "lora"
    path = _write(tmp_path, raw)
    with pytest.raises(InputError) as info:
        load_campaign(path)
    wheres = [p.where for p in info.value.problems]
    assert len(wheres) == 2
    lines = path.read_text().splitlines()
    for p in info.value.problems:
        line_no = int(p.where.split(":")[1].split()[0])
        key = p.where.split()[-1].split(".")[-1]
        assert key in lines[line_no - 1]


def test_h1_missing_section_is_reported_as_missing(tmp_path):
    raw = dict(MINIMAL)
    del raw["hypothesis"]
    with pytest.raises(InputError) as info:
        load_campaign(_write(tmp_path, raw))
    assert "hypothesis" in str(info.value) and "missing" in str(info.value)


def test_h1_bad_yaml_names_the_line(tmp_path):
    path = _write(tmp_path, "name: t\nhypothesis:\n  behaviour: [unclosed\n")
    with pytest.raises(InputError) as info:
        load_campaign(path)
    assert f"{path}:" in str(info.value)


def test_h1_non_utf8_campaign_is_refused(tmp_path):
    path = tmp_path / "campaign.yaml"
    path.write_bytes(b"name: t\xff\n")
    with pytest.raises(InputError, match="UTF-8"):
        load_campaign(path)


def test_h1_overrides_apply_and_are_validated(tmp_path):
    path = _write(tmp_path, MINIMAL)
    assert load_campaign(path, ["training.lr=5e-5"]).training.lr == 5e-5
    assert load_campaign(path, ["data.max_length=256"]).data.max_length == 256
    with pytest.raises(InputError, match="training.lr"):
        load_campaign(path, ["training.lr=-3"])
    with pytest.raises(InputError, match="key.path=value"):
        load_campaign(path, ["training.lr"])


def test_h2_extraction_campaign_needs_a_target_field():
    raw = _with("hypothesis.task", "extraction")
    with pytest.raises(InputError, match="data.fields.target"):
        validate_mapping(raw)


def test_p4_hub_id_without_revision_is_refused(tmp_path):
    (tmp_path / "data.jsonl").write_text("{}\n")
    campaign = validate_mapping(_with("model.name_or_path", "org/some-model"))
    problems = check_campaign(campaign, tmp_path)
    assert any(p.where == "model.revision" for p in problems)


def test_v1_variant_changing_two_groups_is_refused_unless_explained(tmp_path):
    (tmp_path / "data.jsonl").write_text("{}\n")
    both = {"training.lr": 5e-5, "training.microbatch": 4}
    campaign = validate_mapping(_with("variants", {"v": {"explain": "x", "overrides": both}}))
    problems = check_campaign(campaign, tmp_path)
    assert any("2 groups" in p.found for p in problems)
    allowed = {"v": {"explain": "x", "overrides": both, "allow_multi_change": True,
                     "reason": "memory forces it"}}
    assert not check_campaign(validate_mapping(_with("variants", allowed)), tmp_path)


def test_v1_variant_with_a_misspelt_override_is_reported(tmp_path):
    (tmp_path / "data.jsonl").write_text("{}\n")
    campaign = validate_mapping(
        _with("variants", {"v": {"explain": "x", "overrides": {"training.lrr": 1e-3}}})
    )
    problems = check_campaign(campaign, tmp_path)
    assert any("lrr" in str(p) and "did you mean `lr`" in str(p) for p in problems)


def test_v2_variant_may_not_change_the_evaluation_setup(tmp_path):
    (tmp_path / "data.jsonl").write_text("{}\n")
    campaign = validate_mapping(
        _with("variants", {"v": {"explain": "x", "overrides": {"training.eval_every": 5}}})
    )
    assert any("(V2)" in p.found for p in check_campaign(campaign, tmp_path))


def test_v1_variant_campaign_applies_only_its_overrides():
    raw = _with("variants", {"lr-2e-4": {"explain": "x", "overrides": {"training.lr": 2e-4}}})
    campaign = validate_mapping(raw)
    variant = variant_campaign(campaign, "lr-2e-4")
    assert variant.training.lr == 2e-4
    assert variant.training.microbatch == campaign.training.microbatch
    assert variant_diff(campaign, "lr-2e-4") == {"training.lr": [1e-4, 2e-4]}
    assert setting_group("model.lora.r") == "LoRA shape"


@pytest.mark.parametrize("task", TASKS)
def test_h1_every_shipped_template_validates_and_starts_with_its_command(task):
    text = template_text(task)
    assert text.startswith("# Run me:  tunepilot ")
    validate_mapping(yaml.safe_load(text))


def test_h1_config_hash_is_stable_and_changes_with_a_setting():
    a = validate_mapping(MINIMAL).config_hash()
    assert a == validate_mapping(json.loads(json.dumps(MINIMAL))).config_hash()
    assert a != validate_mapping(_with("training.lr", 3e-4)).config_hash()


def test_lazy_imports_campaign_validation_never_imports_torch(tmp_path):
    path = _write(tmp_path, MINIMAL)
    code = (
        "import sys; from tunepilot.campaign import load_campaign; "
        f"load_campaign({str(path)!r}); "
        "heavy = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
