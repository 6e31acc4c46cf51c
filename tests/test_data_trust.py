"""Wrong verdicts and silent acceptances of the data stage, each pinned by the case that showed
it: carved splits that ignored the group (D8), gold answers never held to the answer schema
(H2), one-class data and impossible max_length (D6, S6), split files that are the train file
(D8), generic short turns counted as leaks (D2), and a header-less TSV (D1)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tunepilot.campaign import DataSettings, Fields, SplitPolicy, validate_mapping
from tunepilot.campaign.checks import check_campaign
from tunepilot.data.audit.labels import check_position_limit
from tunepilot.data.audit.run import (
    check_class_balance,
    check_group_leakage,
    check_time_overlap,
    run_audit,
)
from tunepilot.data.load import load_file
from tunepilot.data.prepare import prepare_data
from tunepilot.data.prepared import PreparedData
from tunepilot.data.split import make_splits
from tunepilot.errors import InputError
from tunepilot.tasks.example import Example
from tunepilot.verdict import Verdict

PASS, WARN, FAIL = Verdict.PASS, Verdict.WARN, Verdict.FAIL


def by_check(findings):
    return {f.check: f for f in findings}


def grouped(n_groups: int, per_group: int, prefix: str = "e", **kw) -> list[Example]:
    return [
        Example(id=f"{prefix}{g:03d}-{i}", text=f"{prefix} turn {i} of dialogue {g}",
                source=f"{prefix}.jsonl:{g * per_group + i + 1}", group=f"{prefix}{g}",
                label="a", **kw)  # fmt: skip
        for g in range(n_groups)
        for i in range(per_group)
    ]


def prepared_of(splits, **kw) -> PreparedData:
    return PreparedData({s: splits.get(s, []) for s in ("train", "validation", "test")}, "v",
                        kw.pop("label_names", []), [], {})  # fmt: skip


# ---- D8: a split the tool carves keeps the group and the time order -------------------------


def test_d8_files_policy_carves_the_missing_test_split_by_whole_groups():
    train, val = grouped(40, 5, "t"), grouped(6, 5, "v")
    fields = Fields(text="text", label="label", group="group")
    policy = SplitPolicy(policy="files", test=0.2)
    splits = make_splits({"train": train, "validation": val}, policy, fields)
    train_groups = {ex.group for ex in splits["train"]}
    test_groups = {ex.group for ex in splits["test"]}
    assert splits["test"] and not train_groups & test_groups
    assert 30 <= len(splits["test"]) <= 50  # about 20% of 200 rows, in whole groups of 5
    # The seal of a carved test keeps the unit: the same split again, nothing stray.
    sealed = [ex.id for ex in splits["test"]]
    again = make_splits({"train": train, "validation": val}, policy, fields, sealed)
    assert [ex.id for ex in again["test"]] == sealed


def test_d8_files_policy_carves_the_missing_validation_split_from_the_latest_period():
    train = [Example(id=f"r{i:03d}", text=f"row {i}", source=f"t:{i + 1}", label="a",
                     time=f"2024-01-{1 + i // 4:02d}") for i in range(100)]  # fmt: skip
    fields = Fields(text="text", label="label", time="time")
    splits = make_splits({"train": train}, SplitPolicy(policy="files", test=0.0), fields)
    assert splits["validation"]
    assert max(ex.time for ex in splits["train"]) < min(ex.time for ex in splits["validation"])


def _conversations(n: int) -> list[Example]:
    """n conversations of 3 turns; conversation g starts on day g and its turns run 5 days on,
    so every period boundary cuts through a conversation."""
    return [Example(id=f"c{g:03d}-{t}", text=f"turn {t} of conversation {g}", group=f"c{g:03d}",
                    source=f"f.jsonl:{3 * g + t + 1}", label="a",
                    time=f"2024-{1 + (g + 5 * t) // 28:02d}-{1 + (g + 5 * t) % 28:02d}")
            for g in range(n) for t in range(3)]  # fmt: skip


@pytest.mark.parametrize("policy", ["time", "files"])
def test_d8_a_time_split_with_a_group_keeps_every_group_whole(policy: str):
    """A time split (or a split carved from a train file by time) cut conversations at the
    period boundary: the tool's own group leak, which the audit FAILed, advising a group split
    that loses the time order. Whole groups go by when they began; the rows of a group that
    ran on past the boundary are a WARN, and no advice contradicts the policy."""
    examples = _conversations(40)
    fields = Fields(text="text", label="label", group="group", time="time")
    split = SplitPolicy(policy=policy, validation=0.2, test=0.2)
    splits = make_splits({"train": examples} if policy == "files" else examples, split, fields)
    homes = {}
    for name, rows in splits.items():
        for ex in rows:
            assert homes.setdefault(ex.group, name) == name, f"{ex.group} in two splits"
    assert splits["validation"] and splits["test"]
    source = {"files": {"train": "f.jsonl"}} if policy == "files" else {"file": "f.jsonl"}
    data = DataSettings.model_validate({**source, "split": split.model_dump(),
                                        "fields": fields.model_dump()})  # fmt: skip
    found = by_check(run_audit(prepared_of(splits), data, "classification"))
    assert found["group leakage"].verdict is PASS
    overlap = found["time overlap"]
    assert overlap.verdict is WARN and "ran on past the boundary" in overlap.sentence
    sealed = [ex.id for ex in splits["test"]]  # the seal of this very split applies cleanly
    again = make_splits({"train": examples} if policy == "files" else examples, split, fields,
                        sealed_test_ids=sealed)  # fmt: skip
    assert [ex.id for ex in again["test"]] == sealed


def test_d8_a_leak_under_a_group_or_time_split_is_blamed_on_the_seal_not_the_policy():
    """Under a policy that keeps groups whole a leak can only come from an older sealed test:
    advising `split.policy: group` (or `time` under time) contradicted the policy in force."""
    rows = _conversations(10)
    splits = {"train": rows[:16], "validation": rows[14:23], "test": rows[23:]}  # c004 cut
    for policy in ("time", "group"):
        leak = check_group_leakage(splits, "group", policy)
        assert leak.verdict is FAIL and "split.policy: group" not in leak.sentence
        assert "test_seal.json" in leak.sentence
    overlap = check_time_overlap(splits, "time", "time", "group")
    assert overlap.verdict is FAIL and "use split.policy: time" not in overlap.sentence
    assert "split.policy: group" in check_group_leakage(splits, "group", "random").sentence


@pytest.mark.realdata
def test_d8_sgd_files_with_a_group_field_carve_a_test_without_a_group_leak(shared_data, tmp_path):
    folder = shared_data / "sgd_user_turns"
    for name, n in (("train", 3000), ("test", 600)):  # whole dialogues: rows are contiguous
        with open(folder / f"{name}.jsonl", encoding="utf-8") as handle:
            head = [next(handle) for _ in range(n)]
        (tmp_path / f"{name}.jsonl").write_text("".join(head), "utf-8")
    campaign = validate_mapping({
        "name": "sgd", "hypothesis": {"behaviour": "acts", "task": "extraction"},
        "model": {"name_or_path": "unused-here"},
        "data": {"files": {"train": str(tmp_path / "train.jsonl"),
                           "validation": str(tmp_path / "test.jsonl")},
                 "fields": {"text": "text", "target": "target", "group": "group_id"},
                 "split": {"policy": "files", "test": 0.1}},
    })  # fmt: skip
    prepared = prepare_data(campaign, tmp_path, write=False)
    assert len(prepared.splits["test"]) > 200
    finding = check_group_leakage(prepared.splits, "group_id")
    assert finding.verdict is PASS, finding.sentence


# ---- H2: gold answers are held to the answer schema -----------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": ["string", "null"], "pattern": "^A-[0-9]+$"},
                   "amount": {"type": ["number", "null"], "minimum": 0}},
    "required": ["order_id", "amount"],
}  # fmt: skip


def _extraction(required=("order_id", "amount"), schema=SCHEMA):
    return validate_mapping({
        "name": "x", "model": {"name_or_path": "unused-here"},
        "hypothesis": {"behaviour": "fields", "task": "extraction",
                       "required_fields": list(required), "target_schema": schema},
        "data": {"file": "x.jsonl", "fields": {"target": "answer"}},
    })  # fmt: skip


def _answers(prefix: str, targets: list) -> list[Example]:
    return [Example(id=f"{prefix}{i}", text=f"{prefix} message {i}",
                    source=f"{prefix}.jsonl:{i + 1}", target=t)
            for i, t in enumerate(targets)]  # fmt: skip


def test_h2_gold_answers_that_break_the_schema_fail_the_audit_with_file_and_line():
    good = {"order_id": "A-1", "amount": 3}
    splits = {
        "train": _answers("train", [good, {"order_id": "A-2", "amount": "3"}, good,
                                    {"order_id": "A-3"}]),
        "validation": _answers("val", [good, {"order_id": "B-9", "amount": 1}]),
        "test": _answers("test", [good, good]),
    }  # fmt: skip
    c = _extraction()
    found = by_check(run_audit(prepared_of(splits), c.data, "extraction", hypothesis=c.hypothesis))
    gold = found["gold answers vs the answer schema"]
    assert gold.verdict is FAIL
    assert gold.details["per_split"] == {"train": 2, "validation": 1}
    assert "train.jsonl:2 $.amount: '3' is not of type 'number', 'null'" in gold.sentence
    assert "train.jsonl:4 $: required field 'amount' is missing" in gold.sentence
    assert "val.jsonl:2 $.order_id: 'B-9' does not match" in gold.sentence
    assert gold.examples == ["train1", "train3", "val1"]


def test_h2_gold_answers_that_match_pass_and_no_contract_cannot_validate():
    splits = {"train": _answers("t", [{"order_id": None, "amount": None}]),
              "validation": _answers("v", [{"order_id": "A-7", "amount": 0}])}  # fmt: skip
    c = _extraction()
    found = by_check(run_audit(prepared_of(splits), c.data, "extraction", hypothesis=c.hypothesis))
    assert found["gold answers vs the answer schema"].verdict is PASS
    bare = _extraction(required=(), schema=None)
    found = by_check(run_audit(prepared_of(splits), bare.data, "extraction",
                               hypothesis=bare.hypothesis))  # fmt: skip
    assert found["gold answers vs the answer schema"].verdict is WARN
    assert "cannot validate" in found["gold answers vs the answer schema"].sentence


# ---- D6, S6, D8: one class, impossible max_length, split files that are the train file ------


def test_d6_single_class_training_data_fails_the_audit():
    splits = {"train": grouped(5, 4), "validation": grouped(2, 2, "v")}
    settings = DataSettings.model_validate({"file": "x.jsonl"})
    finding = check_class_balance(splits, ["a"], settings.audit)
    assert finding.verdict is FAIL and "single class" in finding.sentence


def test_s6_max_length_above_the_models_positions_fails_and_within_passes():
    assert check_position_limit(1024, {"max_position_embeddings": 512}).verdict is FAIL
    assert "at most 512" in check_position_limit(1024, {"max_position_embeddings": 512}).sentence
    assert check_position_limit(512, {"max_position_embeddings": 512}).verdict is PASS
    assert check_position_limit(2048, {"n_positions": 1024}).verdict is FAIL  # GPT-2 naming
    assert check_position_limit(64, {}).verdict is WARN  # cannot check: never PASS


def test_s6_audit_reads_the_position_limit_from_the_models_config(tiny_bert_dir, tmp_path):
    from tunepilot.data.flow import audit_findings
    from tunepilot.data.workspace import Workspace

    rows = [{"text": f"message number {i} about {i * 3}", "label": "ab"[i % 2]} for i in range(40)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    campaign = {"name": "x", "hypothesis": {"behaviour": "b", "task": "classification"},
                "model": {"name_or_path": str(tiny_bert_dir)},
                "data": {"file": "d.jsonl", "fields": {"label": "label"}, "max_length": 4096}}
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump(campaign), "utf-8")
    _, findings = audit_findings(Workspace.open(tmp_path / "campaign.yaml"))
    limit = by_check(findings)["max_length vs the model's positions"]
    assert limit.verdict is FAIL and "max_position_embeddings 512" in limit.sentence


def test_s6_validate_refuses_a_max_length_beyond_a_local_models_positions(tiny_bert_dir, tmp_path):
    _write_rows(tmp_path / "d.jsonl", 10)
    campaign = validate_mapping({
        "name": "x", "hypothesis": {"behaviour": "b", "task": "classification"},
        "model": {"name_or_path": str(tiny_bert_dir)},
        "data": {"file": "d.jsonl", "fields": {"label": "label"}, "max_length": 512},
        "variants": {"long": {"explain": "whole tickets",
                              "overrides": {"data.max_length": 2048}}},
    })  # fmt: skip
    problems = check_campaign(campaign, tmp_path)
    assert [p.where for p in problems] == ["variants.long.overrides data.max_length"]
    assert "max_position_embeddings 512" in problems[0].found
    assert problems[0].fix == "set it to at most 512"


def test_s6_a_max_length_beyond_the_positions_is_named_once_not_per_variant(
    tiny_bert_dir, tmp_path
):
    """The campaign's own max_length (or a command-line one) is one problem: the variants that
    inherit it, and the control that has no overrides, are not reported again."""
    _write_rows(tmp_path / "d.jsonl", 10)
    campaign = validate_mapping({
        "name": "x", "hypothesis": {"behaviour": "b", "task": "classification"},
        "model": {"name_or_path": str(tiny_bert_dir)},
        "data": {"file": "d.jsonl", "fields": {"label": "label"}, "max_length": 4096},
        "variants": {"lr": {"explain": "lr", "overrides": {"training.lr": 5e-5}},
                     "long": {"explain": "x", "overrides": {"data.max_length": 8192}}},
    })  # fmt: skip
    problems = check_campaign(campaign, tmp_path)
    assert [p.where for p in problems] == ["data.max_length",
                                           "variants.long.overrides data.max_length"]


def _files_campaign(tmp_path: Path, files: dict[str, str], cleaning=None) -> object:
    data = {"files": files, "fields": {"label": "label"}}
    if cleaning is not None:
        data["cleaning"] = cleaning
    return validate_mapping({"name": "x", "model": {"name_or_path": "minilm"},
                             "hypothesis": {"behaviour": "b", "task": "classification"},
                             "data": data})  # fmt: skip


def _write_rows(path: Path, n: int, start: int = 0) -> None:
    rows = [{"text": f"row {i} says {i * 7}", "label": "ab"[i % 2]}
            for i in range(start, start + n)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")


def test_d8_validate_refuses_a_test_file_that_is_the_train_file(tmp_path: Path):
    _write_rows(tmp_path / "train.jsonl", 30)
    shutil.copy(tmp_path / "train.jsonl", tmp_path / "copy.jsonl")
    _write_rows(tmp_path / "val.jsonl", 10, start=100)
    same_path = _files_campaign(tmp_path, {"train": "train.jsonl", "validation": "val.jsonl",
                                           "test": "./train.jsonl"})  # fmt: skip
    problems = check_campaign(same_path, tmp_path)
    assert [p.where for p in problems] == ["data.files.test"]
    assert "the same file as data.files.train" in problems[0].found
    same_content = _files_campaign(tmp_path, {"train": "train.jsonl", "validation": "val.jsonl",
                                              "test": "copy.jsonl"})  # fmt: skip
    problems = check_campaign(same_content, tmp_path)
    assert [p.where for p in problems] == ["data.files.test"]
    assert "identical in content to data.files.train" in problems[0].found


def test_d2_a_validation_file_emptied_by_dedup_says_it_copies_train(tmp_path: Path):
    _write_rows(tmp_path / "train.jsonl", 30)
    shutil.copy(tmp_path / "train.jsonl", tmp_path / "val.jsonl")
    campaign = _files_campaign(tmp_path, {"train": "train.jsonl", "validation": "val.jsonl"},
                               cleaning=["strip", "drop_exact_duplicates"])  # fmt: skip
    with pytest.raises(InputError) as caught:
        prepare_data(campaign, tmp_path, write=False)
    text = str(caught.value)
    assert "data.files.validation" in text and "all 30 rows of val.jsonl" in text
    assert "30 repeat a row of an earlier split" in text and "copy of the training data" in text
    assert "val.jsonl:1 = " in text and "train.jsonl:1" in text


# ---- D2: generic short turns in different groups are not leaks ------------------------------


def _turn(i: str, text: str, group: str) -> Example:
    return Example(id=i, text=text, source=f"f:{i}", group=group, label="a")


def test_d2_generic_turns_across_groups_warn_and_the_advice_never_asks_for_the_group_split():
    thanks = [_turn(f"t{g}", "thank you very much.", f"g{g}") for g in range(3)]
    other = [_turn(f"o{g}", f"please book table number {g} for dinner", f"g{g}") for g in range(30)]
    splits = {"train": thanks + other,
              "validation": [_turn("v0", "thank you very much", "h0"),
                             *(_turn(f"v{g}", f"unrelated request {g} about trains", f"h{g}")
                               for g in range(1, 10))]}  # fmt: skip
    data = DataSettings.model_validate({"file": "x.jsonl", "fields": {"group": "group"}})
    found = by_check(run_audit(prepared_of(splits), data, "classification"))
    assert found["group leakage"].verdict is PASS
    near = found["near duplicates across splits"]
    assert near.verdict is WARN and "generic short turns" in near.sentence, near.sentence
    assert "split by" not in near.sentence
    # A non-generic near copy across groups still counts, with advice that fits a clean split.
    copy = _turn("v10", "please book table number 7 for dinner tonight", "h10")
    splits["validation"].append(copy)
    near = by_check(run_audit(prepared_of(splits), data, "classification"))[
        "near duplicates across splits"]  # fmt: skip
    assert near.verdict is FAIL and "groups are already apart" in near.sentence
    assert "split by the unit" not in near.sentence and "1 more repeat generic" in near.sentence


@pytest.mark.realdata
def test_d2_sgd_clean_group_split_is_not_failed_by_generic_acknowledgements(shared_data, tmp_path):
    campaign = validate_mapping({
        "name": "sgd", "hypothesis": {"behaviour": "acts", "task": "extraction"},
        "model": {"name_or_path": "unused-here"},
        "data": {"file": str(shared_data / "sgd_user_turns" / "train.jsonl"),
                 "fields": {"text": "text", "target": "target", "group": "group_id"},
                 "split": {"policy": "group"},
                 "cleaning": ["nfc", "strip", "collapse_whitespace", "drop_exact_duplicates"]},
    })  # fmt: skip
    prepared = prepare_data(campaign, tmp_path, write=False)
    found = by_check(run_audit(prepared, campaign.data, "extraction"))
    assert found["group leakage"].verdict is PASS
    near = found["near duplicates across splits"]
    assert near.verdict is WARN, near.sentence
    assert near.details["generic"] > 100 and "split by the unit" not in near.sentence


# ---- D1: a TSV without a header row ---------------------------------------------------------


def test_d1_headerless_tsv_names_data_header_false_and_the_columns(tmp_path: Path):
    lines = ["ham\tsee you at the station at six", "spam\tWIN a free prize now, text 8080",
             "ham\tok, call me when you are home"]  # fmt: skip
    path = tmp_path / "messages.tsv"
    path.write_text("\n".join(lines) + "\n", "utf-8")
    settings = {"file": "messages.tsv", "quoting": False, "fields": {"label": "label"}}
    with pytest.raises(InputError) as caught:
        load_file(path, DataSettings.model_validate(settings), "classification")
    text = str(caught.value)
    assert "messages.tsv:1 data.header" in text and "looks like an example" in text
    assert "`data.header: false`" in text and "`data.columns: [label, text]`" in text
    fixed = DataSettings.model_validate({**settings, "header": False, "columns": ["label", "text"]})
    examples = load_file(path, fixed, "classification")
    assert [ex.label for ex in examples] == ["ham", "spam", "ham"]


@pytest.mark.realdata
def test_d1_sms_spam_collection_read_with_its_first_message_as_header_is_explained(shared_data):
    path = shared_data / "sms_spam" / "SMSSpamCollection"
    settings = {"file": str(path), "quoting": False, "fields": {"label": "label"}}
    with pytest.raises(InputError) as caught:
        load_file(path, DataSettings.model_validate(settings), "classification")
    assert "`data.columns: [label, text]`" in str(caught.value)
    fixed = DataSettings.model_validate({**settings, "header": False, "columns": ["label", "text"]})
    assert len(load_file(path, fixed, "classification")) == 5574


def test_d8_validate_cli_exits_2_on_a_test_file_equal_to_train(tmp_path: Path):
    _write_rows(tmp_path / "train.jsonl", 12)
    _write_rows(tmp_path / "val.jsonl", 4, start=50)
    campaign = {"name": "x", "model": {"name_or_path": "minilm"},
                "hypothesis": {"behaviour": "b", "task": "classification"},
                "data": {"files": {"train": "train.jsonl", "validation": "val.jsonl",
                                   "test": "train.jsonl"}, "fields": {"label": "label"}}}
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump(campaign), "utf-8")
    done = subprocess.run([sys.executable, "-m", "tunepilot.cli", "validate",
                           str(tmp_path / "campaign.yaml")], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2 and "data.files.test" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
