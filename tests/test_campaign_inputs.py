"""The campaign file and the command line refuse what would train the wrong thing (V1, V2, D8).

Variant overrides are leaf settings however the YAML nests them; every bound lives in the
schema once; a wrong command-line override names the argument, not a line of the file.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from campaign_support import with_setting
from tunepilot.campaign import load_campaign, validate_mapping
from tunepilot.campaign.checks import campaign_warnings, check_campaign
from tunepilot.campaign.variants import parse_seeds, variant_campaign, variant_diff
from tunepilot.errors import InputError

MINIMAL = {
    "name": "t",
    "hypothesis": {"behaviour": "route tickets", "task": "classification"},
    "model": {"name_or_path": "minilm"},
    "data": {"file": "data.jsonl", "fields": {"label": "queue"}},
    "training": {"accumulation": 4, "eval_every": 10, "checkpoint_every": 5,
                 "budget": {"updates": 40}, "stop": {"max_loss": 20.0}},
}  # fmt: skip
TUNEPILOT = [sys.executable, "-m", "tunepilot.cli"]


def _with(key: str, value) -> dict:
    return with_setting(MINIMAL, key, value)


def _variants(**variants) -> dict:
    return _with("variants", {n: {"explain": "x", "overrides": o} for n, o in variants.items()})


# -- V1: overrides deep-merge to leaf keys -----------------------------------------------------


def test_v1_nested_variant_override_keeps_every_sibling_setting_of_the_control():
    campaign = validate_mapping(_variants(nested={"training": {"lr": 2e-4}}))
    variant = variant_campaign(campaign, "nested")
    assert variant.training.lr == 2e-4
    # the siblings the nested mapping did not name keep the control's values, not the defaults
    control = campaign.training
    assert (variant.training.accumulation, variant.training.eval_every) == (4, 10)
    assert variant.training.checkpoint_every == control.checkpoint_every == 5
    assert variant.training.budget.updates == 40 and variant.training.stop.max_loss == 20.0
    assert variant_diff(campaign, "nested") == {"training.lr": [1e-4, 2e-4]}


def test_v1_nested_variant_changing_two_groups_is_refused_like_the_dotted_one(tmp_path):
    (tmp_path / "data.jsonl").write_text("{}\n")
    nested = validate_mapping(_variants(v={"training": {"lr": 2e-4, "microbatch": 4}}))
    dotted = validate_mapping(_variants(v={"training.lr": 2e-4, "training.microbatch": 4}))
    mixed = validate_mapping(_variants(v={"training": {"lr": 2e-4, "budget.updates": 9}}))
    for campaign in (nested, dotted, mixed):
        assert any("2 groups" in p.found for p in check_campaign(campaign, tmp_path))
    assert variant_diff(nested, "v") == variant_diff(dotted, "v")


def test_v2_nested_override_of_the_evaluation_procedure_is_refused(tmp_path):
    (tmp_path / "data.jsonl").write_text("{}\n")
    for overrides in ({"training": {"eval_every": 5}}, {"training": {"stop": {"max_loss": 9}}},
                      {"training": {"max_new_tokens": 8}}, {"data": {"split": {"seed": 3}}}):
        campaign = validate_mapping(_variants(v=overrides))
        problems = check_campaign(campaign, tmp_path)
        assert any("(V2)" in p.found for p in problems), overrides


def test_v1_override_equal_to_the_control_is_not_a_change(tmp_path):
    (tmp_path / "data.jsonl").write_text("{}\n")
    same = validate_mapping(_variants(v={"training": {"lr": 2e-4, "accumulation": 4}}))
    assert not check_campaign(same, tmp_path)  # one real change: the learning rate
    nothing = validate_mapping(_variants(v={"training": {}}))
    assert any("changes nothing" in p.found for p in check_campaign(nothing, tmp_path))


def test_h1_nested_command_line_override_merges_into_the_file(tmp_path):
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(MINIMAL))
    campaign = load_campaign(path, ["training={lr: 5.0e-5}"])
    assert campaign.training.lr == 5e-5 and campaign.training.accumulation == 4


# -- H1: a wrong command-line override names the argument --------------------------------------


def test_h1_wrong_dotted_override_names_the_command_line_argument_not_a_yaml_line(tmp_path):
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(MINIMAL))
    with pytest.raises(InputError) as info:
        load_campaign(path, ["training.lrr=1"])
    (problem,) = info.value.problems
    assert problem.where == "command-line override `training.lrr=1`"
    assert "did you mean `lr`" in problem.fix
    with pytest.raises(InputError) as info:
        load_campaign(path, ["training.budget.epochs=2"])  # the file's updates: 40 remains
    (problem,) = info.value.problems
    assert "campaign.yaml:" in problem.where and "`training.budget.epochs=2`" in problem.where


# -- H1: bounds in the schema, once ------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "where", "words"),
    [
        ("training.weight_decay", float("inf"), "training.weight_decay", "finite"),
        ("training.budget", {"epochs": float("inf")}, "training.budget.epochs", "finite"),
        ("training.lr", float("nan"), "training.lr", "finite"),
        ("data.max_length", 1e9, "data.max_length", "less than or equal"),
        ("seeds", [], "seeds", "at least 1"),
        ("seeds", [-1], "seeds.0", "greater than or equal to 0"),
        ("seeds", [2**70], "seeds.0", "less than or equal"),
        ("seeds", [1, 1], "seeds", "twice"),
        ("seeds", [True], "seeds.0", "yes/no value"),
        ("training.seed", True, "training.seed", "yes/no value"),
        ("model.lora.r", True, "model.lora.r", "yes/no value"),
        ("training.microbatch", True, "training.microbatch", "yes/no value"),
        ("training.lr", True, "training.lr", "yes/no value"),
        ("training.budget.updates", True, "training.budget.updates", "yes/no value"),
        ("model.lora.target_modules", [], "model.lora.target_modules", "at least 1"),
        ("training.seed", -5, "training.seed", "greater than or equal to 0"),
        ("variants", {"../../etc": {"explain": "x", "overrides": {"training.lr": 1e-3}}},
         "variants.../../etc", "folder name"),
        ("variants", {".hidden": {"explain": "x", "overrides": {"training.lr": 1e-3}}},
         "variants..hidden", "folder name"),
        ("data.labels", ["refund", "cancel", "refund"], "data.labels", "'refund'"),
        ("hypothesis.classification_guards.class_floors", {"a": 2}, "class_floors.a", "less"),
    ],
)
def test_h1_values_that_were_accepted_are_refused_with_key_and_fix(key, value, where, words):
    with pytest.raises(InputError) as info:
        validate_mapping(_with(key, value))
    text = str(info.value)
    assert where in text and words in text, text


def test_v6_seeds_on_the_command_line_follow_the_campaign_rule():
    assert parse_seeds(None, [3, 4]) == [3, 4]
    assert parse_seeds("0, 2", [3]) == [0, 2]
    for bad in (" ", "", ",", "-3", "0,0", str(2**40), "a"):
        with pytest.raises(InputError, match="--seeds"):
            parse_seeds(bad, [0])


def test_r4_trust_remote_code_is_warned_at_validate_and_listed_in_the_report(tmp_path):
    from tunepilot.data.workspace import Workspace
    from tunepilot.report.collect import collect

    raw = _with("model.trust_remote_code", True)
    assert not campaign_warnings(validate_mapping(MINIMAL))
    (tmp_path / "data.jsonl").write_text('{"text": "x", "queue": "q"}\n')
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = subprocess.run([*TUNEPILOT, "validate", str(path)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warning" in result.stderr and "trust_remote_code" in result.stderr
    limits = collect(Workspace.open(path))["limits"]
    assert any("trust_remote_code" in x["sentence"] and x["severity"] == "WARN" for x in limits)


def test_h1_top_level_list_with_an_override_exits_2_not_a_traceback(tmp_path):
    path = tmp_path / "campaign.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(InputError, match="top level is list"):
        load_campaign(path, ["training.lr=1e-4"])
    inner = tmp_path / "inner.yaml"
    inner.write_text(yaml.safe_dump(_with("data.cleaning", ["nfc"])))
    with pytest.raises(InputError, match="not a section"):
        load_campaign(inner, ["data.cleaning.0=strip"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "{c}", "--stop-after", "-3"], "--stop-after"),
        (["run", "{c}", "--seeds", " "], "--seeds"),
        (["run", "{c}", "--seeds", "-1"], "--seeds"),
        (["resume", "x-s0-1", "{c}", "--stop-after", "0"], "--stop-after"),
    ],
)
def test_v1_bad_run_options_exit_2_before_anything_runs(tmp_path, args, needle):
    (tmp_path / "data.jsonl").write_text('{"text": "x", "queue": "q"}\n')
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(MINIMAL))
    result = subprocess.run([*TUNEPILOT, *[a.replace("{c}", str(path)) for a in args]],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert needle in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "tunepilot.db").exists()


def test_h1_a_bracketed_override_is_printed_whole_not_eaten_as_markup(tmp_path):
    """`data.cleaning=[bogus]` was shown as `data.cleaning=`: the terminal's markup took the
    brackets. Every problem prints the argument, the value and the fix as written."""
    (tmp_path / "data.jsonl").write_text('{"text": "x", "queue": "q"}\n')
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(MINIMAL))
    result = subprocess.run([*TUNEPILOT, "validate", str(path), "data.cleaning=[bogus]",
                             "seeds=[yes]"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    flat = " ".join(result.stderr.split())
    assert "`data.cleaning=[bogus]`" in flat and "`seeds=[yes]`" in flat, flat
    assert "yes/no value" in flat


@pytest.mark.parametrize(
    ("text", "override", "words"),
    [
        ("a: &x [*x]\n", None, "used inside itself"),
        ("x: " + "[" * 5000 + "]" * 5000 + "\n", None, "nested too deeply"),
        (None, "seeds=&x [*x]", "used inside itself"),
        (None, "training.lr=" + "[" * 5000 + "]" * 5000, "nested too deeply"),
    ],
)
def test_h1_a_self_referencing_or_deeply_nested_yaml_is_bad_input(
    tmp_path, text, override, words
):
    """Both were a RecursionError or a circular-reference ValueError (exit 3): a YAML alias
    inside its own anchor, and nesting beyond the reader's limit, in the file or an override."""
    path = tmp_path / "campaign.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(MINIMAL))
    with pytest.raises(InputError, match=words) as info:
        load_campaign(path, [override] if override else None)
    assert str(path) in info.value.problems[0].where or "override" in info.value.problems[0].where
