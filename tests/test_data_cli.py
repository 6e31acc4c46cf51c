"""The data commands through the real entry point (`python -m tunepilot.cli data ...`) on small
demo campaigns: exit codes, JSON payloads, the files left next to the data version, the loss
mask as `data show` prints it, and bad input named by file:line (D1-D8, S6, H4).

Each CLI call costs a few seconds of imports, so every test makes one call and asserts
everything that call shows. The classification campaign's first audit runs in a fixture, so
the sealed test split is drawn by the campaign's own group policy before any override runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tunepilot.demo.campaign import write_demo_campaign

TUNEPILOT = [sys.executable, "-m", "tunepilot.cli"]
# Rich wraps at the terminal width (80 in a pipe): a wide one keeps file:line on one line.
ENV = {**os.environ, "COLUMNS": "250"}


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TUNEPILOT, *map(str, args)], capture_output=True, text=True, env=ENV, timeout=300
    )


def rows_by_id(campaign: Path) -> dict[str, dict[str, Any]]:
    """The demo data file as written, keyed by example id: the truth the CLI is checked on."""
    lines = (campaign.parent / "data" / "tickets.jsonl").read_text("utf-8").splitlines()
    return {row["id"]: row for row in map(json.loads, lines)}


def by_check(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["check"]: f for f in payload["findings"]}


def version_folder(campaign: Path, version: str) -> Path:
    return campaign.parent / "data" / version


def read_splits(campaign: Path, version: str) -> dict[str, Any]:
    """data/<version>/splits.json, the record of which example went where (D1)."""
    return json.loads((version_folder(campaign, version) / "splits.json").read_text())


@pytest.fixture(scope="module")
def cls_campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated tickets (40 conversations, 6 queues) on a tiny BERT, split by conversation."""
    return write_demo_campaign(tmp_path_factory.mktemp("cls"), tiny=True, n_conversations=40)


@pytest.fixture(scope="module")
def cls_audit(cls_campaign: Path) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """The campaign's own audit, run first. Looking never seals; the first command that uses
    the data for real does (here `Workspace.prepare()`, as `baseline` or `run` would)."""
    result = cli("data", "audit", cls_campaign, "--json")
    assert not (cls_campaign.parent / "data" / "test_seal.json").exists()
    from tunepilot.data.workspace import Workspace

    Workspace.open(cls_campaign).prepare()
    assert result.returncode in (0, 1), result.stderr
    return result, json.loads(result.stdout)


@pytest.fixture(scope="module")
def ext_campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The extraction demo (tiny Llama, JSON answers) on 30 conversations.

    max_length 256: the tiny tokenizer is close to byte level (prompt + answer take 160-200
    tokens), and the template's 128 would cut the answers this test decodes.
    """
    return write_demo_campaign(
        tmp_path_factory.mktemp("ext"),
        "extraction",
        tiny=True,
        n_conversations=30,
        overrides={"data.max_length": 256},
    )


# --------------------------------------------------------------------------------------------
# data audit
# --------------------------------------------------------------------------------------------


def test_d1_d8_h4_audit_json_exit_code_follows_findings_and_writes_version_files(
    cls_campaign, cls_audit
):
    result, payload = cls_audit
    assert set(payload) == {"version", "counts", "findings"}
    verdicts = [f["verdict"] for f in payload["findings"]]
    assert set(verdicts) <= {"PASS", "WARN", "FAIL"} and verdicts
    assert result.returncode == (1 if "FAIL" in verdicts else 0)
    for finding in payload["findings"]:
        assert finding["check"] and finding["sentence"] and finding["requirement"]
    found = by_check(payload)
    assert found["group leakage"]["verdict"] == "PASS"  # the demo splits by conversation
    assert "D8" in found["group leakage"]["requirement"]

    folder = version_folder(cls_campaign, payload["version"])
    splits = json.loads((folder / "splits.json").read_text())
    assert splits["version"] == payload["version"]
    assert splits["counts"] == payload["counts"]
    assert set(payload["counts"]) == {"train", "validation", "test"}
    assert all(payload["counts"][s] > 0 for s in payload["counts"])
    # every line of the file is either in exactly one split or dropped by a cleaning rule (D1)
    dropped = [i for rule in splits["cleaning"] for i in rule["example_ids"] if rule["dropped"]]
    placed = [i for ids in splits["ids"].values() for i in ids]
    assert len(placed) == len(set(placed)) == sum(payload["counts"].values())
    assert sorted(placed + dropped) == sorted(rows_by_id(cls_campaign))
    # group policy: no conversation in two splits, checked from the data file itself
    rows = rows_by_id(cls_campaign)
    conv = {s: {rows[i]["conversation_id"] for i in ids} for s, ids in splits["ids"].items()}
    assert not (conv["train"] & conv["validation"]) and not (conv["train"] & conv["test"])

    audit = json.loads((folder / "audit.json").read_text())
    assert audit["version"] == payload["version"]
    assert audit["findings"] == payload["findings"]
    seal = json.loads((cls_campaign.parent / "data" / "test_seal.json").read_text())
    assert seal["ids"] == splits["ids"]["test"]  # H4: the sealed test split is on disk


def test_d8_random_split_on_grouped_data_fails_group_leakage_naming_conversations(
    cls_campaign, cls_audit
):
    _, grouped = cls_audit
    result = cli("data", "audit", cls_campaign, "data.split.policy=random", "--json")
    assert result.returncode == 1, result.stderr
    payload = json.loads(result.stdout)
    assert payload["version"] != grouped["version"]  # another split is another data version
    leak = by_check(payload)["group leakage"]
    assert leak["verdict"] == "FAIL" and leak["requirement"] == "D8"
    assert "conversation_id" in leak["sentence"] and "split.policy: group" in leak["sentence"]
    named = leak["details"]["group_values"]
    assert named and all(v.startswith("c-") for v in named)
    assert any(v in leak["sentence"] for v in named[:3])
    # independently: each example the finding names shares its conversation with training
    rows = rows_by_id(cls_campaign)
    splits = read_splits(cls_campaign, payload["version"])
    train_convs = {rows[i]["conversation_id"] for i in splits["ids"]["train"]}
    assert leak["examples"]
    for example_id in leak["examples"]:
        assert example_id not in splits["ids"]["train"]
        assert rows[example_id]["conversation_id"] in train_convs
    # H4: changing the policy does not redraw the sealed test split
    assert payload["counts"]["test"] == grouped["counts"]["test"]


def test_s6_extraction_max_length_8_fails_truncation_with_the_cut_ids(ext_campaign):
    result = cli("data", "audit", ext_campaign, "data.max_length=8", "--json")
    assert result.returncode == 1, result.stderr
    payload = json.loads(result.stdout)
    length = by_check(payload)["length and truncation"]
    assert length["verdict"] == "FAIL" and "S6" in length["requirement"]
    assert "lose answer tokens at max_length 8" in length["sentence"]
    total = sum(payload["counts"].values())
    assert length["details"]["target_truncated"] == total  # every answer is cut at 8 tokens
    assert length["details"]["needed_max_length"] > 8
    assert (
        f"raise data.max_length to {length['details']['needed_max_length']}" in (length["sentence"])
    )
    rows = rows_by_id(ext_campaign)
    assert length["examples"] and set(length["examples"]) <= set(rows)
    assert all(i in length["sentence"] for i in length["examples"][:3])
    # only the truncation check fails: the rest of the data is sound
    assert [f["check"] for f in payload["findings"] if f["verdict"] == "FAIL"] == [
        "length and truncation"
    ]


# --------------------------------------------------------------------------------------------
# data show
# --------------------------------------------------------------------------------------------


def test_d3_classification_show_puts_no_loss_on_tokens_and_states_the_label(
    cls_campaign, cls_audit
):
    _, audit = cls_audit
    result = cli("data", "show", cls_campaign, "-n", "2", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["version"] == audit["version"] and payload["split"] == "train"
    samples = payload["samples"]
    assert len(samples) == 2
    splits = read_splits(cls_campaign, audit["version"])
    rows = rows_by_id(cls_campaign)
    for sample in samples:
        assert sample["id"] in splits["ids"]["train"]
        assert sample["kind"] == "classification"
        assert sample["tokens"] and not any(t["loss"] for t in sample["tokens"])
        assert sample["label"] == rows[sample["id"]]["queue"]
        class_id = splits["label_names"].index(sample["label"])
        assert sample["loss_on_label"] == sample["expected"] == f"{sample['label']} (id {class_id})"
        assert len(sample["tokens"]) == min(sample["full_length"], 64)  # data.max_length 64
        assert sample["truncated"] == (sample["full_length"] > 64)


def test_d4_per_class_shows_one_example_of_each_class_in_id_order(cls_campaign, cls_audit):
    _, audit = cls_audit
    result = cli("data", "show", cls_campaign, "--per-class", "1", "--json")
    assert result.returncode == 0, result.stderr
    samples = json.loads(result.stdout)["samples"]
    splits = read_splits(cls_campaign, audit["version"])
    names = splits["label_names"]
    assert len(names) == 6
    assert [s["label"] for s in samples] == names  # one per class, in label-id order
    rows = rows_by_id(cls_campaign)
    for sample in samples:
        assert rows[sample["id"]]["queue"] == sample["label"]
        assert sample["id"] in splits["ids"]["train"]


def test_d3_text_show_prints_tokens_and_the_loss_on_label_line(cls_campaign, cls_audit):
    result = cli("data", "show", cls_campaign, "-n", "1")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    words = set(out.split())
    shown = [row for i, row in rows_by_id(cls_campaign).items() if i in words]
    assert len(shown) == 1, out  # the one example shown, named by its id
    label = shown[0]["queue"]
    assert f"class {label}" in out
    assert f"loss on label: {label} (id " in out
    assert "no token carries loss" in out
    assert "|" in out and "␣" in out  # separators and visible spaces (D3)


def test_d3_d5_extraction_loss_positions_decode_to_exactly_the_json_answer_and_eos(
    ext_campaign,
):
    from transformers import AutoTokenizer

    result = cli("data", "show", ext_campaign, "-n", "2", "--json")
    assert result.returncode == 0, result.stderr
    samples = json.loads(result.stdout)["samples"]
    assert len(samples) == 2
    tok = AutoTokenizer.from_pretrained(ext_campaign.parent / "base-model")
    raw = yaml.safe_load(ext_campaign.read_text())
    rows = rows_by_id(ext_campaign)
    for sample in samples:
        row = rows[sample["id"]]
        answer = json.dumps(row["fields"], ensure_ascii=False, separators=(",", ":"))
        flags = [t["loss"] for t in sample["tokens"]]
        first = flags.index(True)
        assert all(flags[first:]) and not any(flags[:first])  # prompt masked, answer carries loss
        loss_ids = [t["id"] for t in sample["tokens"][first:]]
        prompt_ids = [t["id"] for t in sample["tokens"][:first]]
        assert tok.decode(loss_ids, skip_special_tokens=False) == answer + tok.eos_token
        assert "".join(t["token"] for t in sample["tokens"][first:]) == answer + tok.eos_token
        assert loss_ids == tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert json.loads(tok.decode(loss_ids, skip_special_tokens=True)) == row["fields"]
        prompt = raw["data"]["template"].format(text=row["text"])
        assert tok.decode(prompt_ids, skip_special_tokens=True) == prompt
        assert sample["n_loss_tokens"] == len(loss_ids)
        assert sample["expected"] == answer and sample["label"] is None
        assert not sample["truncated"] and not sample["target_truncated"]


# --------------------------------------------------------------------------------------------
# bad input: exit 2, named by file:line or key, nothing on stdout
# --------------------------------------------------------------------------------------------


def broken_campaign(tmp_path: Path, cls_campaign: Path, data: bytes) -> tuple[Path, Path]:
    """A copy of the demo campaign whose data file is `data`; returns (campaign, data file)."""
    raw = yaml.safe_load(cls_campaign.read_text())
    raw["model"]["name_or_path"] = str(cls_campaign.parent / "base-model")
    (tmp_path / "data").mkdir()
    data_file = tmp_path / "data" / "tickets.jsonl"
    data_file.write_bytes(data)
    campaign = tmp_path / "campaign.yaml"
    campaign.write_text(yaml.safe_dump(raw, sort_keys=False))
    return campaign, data_file


def good_lines(cls_campaign: Path, n: int) -> list[bytes]:
    return (cls_campaign.parent / "data" / "tickets.jsonl").read_bytes().splitlines()[:n]


def assert_json_error_only(stdout: str) -> None:
    """With --json, stdout is one JSON document: the error and its problems, no findings."""
    doc = json.loads(stdout)
    assert doc["exit_code"] == 2 and doc["problems"]
    assert not {"findings", "samples", "version"} & set(doc)


def test_d1_malformed_json_lines_exit_2_naming_every_file_line(tmp_path, cls_campaign):
    lines = good_lines(cls_campaign, 4)
    lines.insert(2, b'{"id": "bad-3", "text": , "queue": "billing"}')  # line 3
    lines.insert(4, b'{"id": "bad-5", "text": "no closing brace"')  # line 5
    campaign, data_file = broken_campaign(tmp_path, cls_campaign, b"\n".join(lines) + b"\n")
    result = cli("data", "audit", campaign, "--json")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert_json_error_only(result.stdout)  # a --json reader gets no half answer
    assert f"{data_file}:3: not valid JSON" in result.stderr
    assert f"{data_file}:5: not valid JSON" in result.stderr  # every problem at once
    assert ":1:" not in result.stderr and ":2:" not in result.stderr
    assert "fix:" in result.stderr
    assert not (tmp_path / "data" / "test_seal.json").exists()  # nothing sealed from bad data


def test_d1_non_utf8_byte_exits_2_naming_file_line_and_byte(tmp_path, cls_campaign):
    lines = good_lines(cls_campaign, 3)
    lines.append(b'{"id": "latin-4", "text": "caf\xe9 order ORD-1 broke", "queue": "billing"}')
    campaign, data_file = broken_campaign(tmp_path, cls_campaign, b"\n".join(lines) + b"\n")
    result = cli("data", "show", campaign, "--json")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert_json_error_only(result.stdout)
    assert f"{data_file}:4: not UTF-8: byte 0xe9" in result.stderr
    assert "iconv" in result.stderr


def test_unknown_override_key_exits_2_with_the_key_and_did_you_mean(cls_campaign):
    result = cli("data", "audit", cls_campaign, "data.fieldz.text=x")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "data.fieldz" in result.stderr
    assert "did you mean `fields`" in result.stderr


def test_d3_unknown_split_on_show_exits_2_listing_the_splits(cls_campaign, cls_audit):
    result = cli("data", "show", cls_campaign, "--split", "nowhere")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "--split" in result.stderr and "`nowhere`" in result.stderr
    assert "train, validation, test" in result.stderr
