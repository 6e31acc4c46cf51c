"""The audit's checks for silent mistakes in real data (D2, D3, D5, D6): a label that
contradicts a copy of its text, a class spelt two ways, the answer written in the input, splits
built by different scripts, special tokens written twice. Each planted mistake is caught with
its rows named; the same real data without it stays clean (no alarm)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from tunepilot.campaign import validate_mapping
from tunepilot.data.audit.run import run_audit
from tunepilot.data.prepare import prepare_data
from tunepilot.verdict import Verdict

PASS, WARN, FAIL = Verdict.PASS, Verdict.WARN, Verdict.FAIL
DEFAULT_CLEANING = ["nfc", "strip", "collapse_whitespace", "drop_empty"]


def audit(root: Path, data: dict, task: str = "classification") -> dict:
    c = validate_mapping({"name": "real", "hypothesis": {"behaviour": "b", "task": task},
                          "model": {"name_or_path": "unused-here"}, "data": data})  # fmt: skip
    prepared = prepare_data(c, root, write=False)
    return {f.check: f for f in run_audit(prepared, c.data, task)}


def sms_rows(shared_data: Path, n: int = 2000) -> list[str]:
    return (shared_data / "sms_spam" / "SMSSpamCollection").read_text().splitlines()[:n]


def sms_campaign(name: str, cleaning: list[str]) -> dict:
    return {"file": name, "format": "tsv", "quoting": False, "header": False,
            "columns": ["label", "text"], "fields": {"label": "label"}, "cleaning": cleaning}


def banking_rows(shared_data: Path, n: int = 3000) -> list[dict]:
    with open(shared_data / "banking77" / "train.csv", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))[:n]


def write_csv(path: Path, rows: list[dict]) -> str:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, ["text", "category"])
        writer.writeheader()
        writer.writerows(rows)
    return path.name


BANKING = {"fields": {"label": "category"}}


# --------------------------------------------------------------------------------------------
# conflicting labels (D2, D6)
# --------------------------------------------------------------------------------------------


@pytest.mark.realdata
@pytest.mark.parametrize("cleaning", [DEFAULT_CLEANING, [*DEFAULT_CLEANING,
                                                         "drop_exact_duplicates"]])  # fmt: skip
def test_d2_d6_a_ham_text_copied_as_spam_is_caught_and_deduplication_never_hides_it(
    shared_data: Path, tmp_path: Path, cleaning: list[str]
) -> None:
    """A training ham text copied once as spam into the test file: FAIL (the test scores a
    correct answer as wrong); with drop_exact_duplicates the copy is dropped, and the audit
    still names both rows (WARN: the kept label is whichever came first)."""
    rows = sms_rows(shared_data)
    ham = next(r for r in rows[40:] if r.startswith("ham\t")).split("\t", 1)[1]
    test = [*rows[1500:], f"spam\t {ham.upper()}"]  # another case and a space: the same text
    (tmp_path / "train.tsv").write_text("\n".join(rows[:1500]) + "\n", encoding="utf-8")
    (tmp_path / "test.tsv").write_text("\n".join(test) + "\n", encoding="utf-8")
    data = {**sms_campaign("train.tsv", cleaning), "file": None,
            "files": {"train": "train.tsv", "test": "test.tsv"}}  # fmt: skip
    found = audit(tmp_path, data)
    conflict = found["conflicting labels"]
    assert f"test.tsv:{len(test)}" in conflict.sentence, conflict.sentence  # the copy
    assert "'ham'" in conflict.sentence and "'spam'" in conflict.sentence
    if "drop_exact_duplicates" in cleaning:  # the rule kept one label and dropped the other
        assert conflict.verdict is WARN and conflict.details["hidden_by_dedup"] == 1
        assert "drop_exact_duplicates" in conflict.sentence
        assert "another label" in found["cleaning"].sentence
    else:
        assert conflict.verdict is FAIL and conflict.details["across_splits"] == 1
        assert "scores a correct answer as wrong" in conflict.sentence


@pytest.mark.realdata
def test_d2_d6_a_contradiction_inside_training_only_warns(
    shared_data: Path, tmp_path: Path
) -> None:
    rows = sms_rows(shared_data, 600)
    ham = next(r for r in rows if r.startswith("ham\t")).split("\t", 1)[1]
    (tmp_path / "train.tsv").write_text("\n".join([*rows, f"spam\t{ham}"]) + "\n")
    more = sms_rows(shared_data, 900)
    (tmp_path / "validation.tsv").write_text("\n".join(more[600:750]) + "\n")
    (tmp_path / "test.tsv").write_text("\n".join(more[750:]) + "\n")
    files = {"train": "train.tsv", "validation": "validation.tsv", "test": "test.tsv"}
    data = {**sms_campaign("train.tsv", DEFAULT_CLEANING), "file": None, "files": files}
    conflict = audit(tmp_path, data)["conflicting labels"]
    assert conflict.verdict is WARN and "train.tsv:601" in conflict.sentence, conflict.sentence


@pytest.mark.realdata
def test_d2_d6_real_sms_and_banking77_have_no_conflicting_label(
    shared_data: Path, tmp_path: Path
) -> None:
    """The clean control: sms_spam repeats 281 texts, always with the same label; banking77's
    only conflicts need punctuation removed, which normalisation does not do (SOURCES.md)."""
    (tmp_path / "sms.tsv").write_text("\n".join(sms_rows(shared_data, 6000)) + "\n")
    for cleaning in (DEFAULT_CLEANING, [*DEFAULT_CLEANING, "drop_exact_duplicates"]):
        found = audit(tmp_path, sms_campaign("sms.tsv", cleaning))
        assert found["conflicting labels"].verdict is PASS, found["conflicting labels"].sentence
    folder = shared_data / "banking77"
    found = audit(tmp_path, {**BANKING, "files": {"train": str(folder / "train.csv"),
                                                  "test": str(folder / "test.csv")}})  # fmt: skip
    assert found["conflicting labels"].verdict is PASS, found["conflicting labels"].sentence


# --------------------------------------------------------------------------------------------
# label spellings (D6)
# --------------------------------------------------------------------------------------------


@pytest.mark.realdata
def test_d6_a_class_spelt_two_ways_fails_naming_both_spellings(
    shared_data: Path, tmp_path: Path
) -> None:
    rows = banking_rows(shared_data)
    arrival = [r for r in rows if r["category"] == "card_arrival"]
    for r in arrival[::3]:
        r["category"] = "Card-Arrival "  # another export: case, a dash, a trailing space
    found = audit(tmp_path, {**BANKING, "file": write_csv(tmp_path / "b.csv", rows)})
    spelling = found["label spellings"]
    assert spelling.verdict is FAIL, spelling.sentence
    assert "`card_arrival`" in spelling.sentence and "`Card-Arrival `" in spelling.sentence
    assert "b.csv:" in spelling.sentence
    clean = audit(tmp_path, {**BANKING, "file": write_csv(tmp_path / "c.csv",
                                                          banking_rows(shared_data))})  # fmt: skip
    assert clean["label spellings"].verdict is PASS, clean["label spellings"].sentence


# --------------------------------------------------------------------------------------------
# the answer written in the input (D2, D5)
# --------------------------------------------------------------------------------------------


@pytest.mark.realdata
def test_d2_the_class_name_written_into_its_text_fails_above_the_declared_share(
    shared_data: Path, tmp_path: Path
) -> None:
    rows = banking_rows(shared_data)
    rng = random.Random(0)
    for r in rows:  # a quarter of the rows carry their class, as a tag an export left in
        if rng.random() < 0.25:
            r["text"] += f" #{r['category'].replace('_', '')}"
    found = audit(tmp_path, {**BANKING, "file": write_csv(tmp_path / "tagged.csv", rows)})
    leak = found["answer written in the input"]
    assert leak.verdict is FAIL, leak.sentence
    assert leak.details["share_per_split"]["train"] > 0.2
    assert "tagged.csv:" in leak.sentence and "target_leak_share 10%" in leak.sentence
    # declared share above what the data shows: judged by the user's own bound
    tolerant = audit(tmp_path, {**BANKING, "file": "tagged.csv",
                                "audit": {"target_leak_share": 0.5}})  # fmt: skip
    assert tolerant["answer written in the input"].verdict is PASS


@pytest.mark.realdata
def test_d2_real_intent_data_names_its_class_in_few_rows_and_passes(
    shared_data: Path, tmp_path: Path
) -> None:
    """The clean control: "exchange rate" is how people ask about exchange_rate; it is a few
    percent of banking77 and snips, under the default share."""
    found = audit(tmp_path, {**BANKING, "file": write_csv(tmp_path / "b.csv",
                                                          banking_rows(shared_data))})  # fmt: skip
    leak = found["answer written in the input"]
    assert leak.verdict is PASS and 0 < leak.details["share_per_split"]["train"] < 0.1
    snips = shared_data / "snips" / "test.jsonl"
    found = audit(tmp_path, {"file": str(snips), "fields": {"label": "intent"}})
    assert found["answer written in the input"].verdict is PASS


@pytest.mark.realdata
def test_d2_d5_an_extraction_answer_pasted_into_the_prompt_fails_copied_values_do_not(
    shared_data: Path, tmp_path: Path
) -> None:
    rows = [json.loads(line) for line in
            (shared_data / "snips" / "test.jsonl").read_text().splitlines()]  # fmt: skip
    data = {"fields": {"target": "slots"}}
    clean = audit(tmp_path, {**data, "file": str(shared_data / "snips" / "test.jsonl")},
                  "extraction")  # fmt: skip
    assert clean["answer written in the input"].verdict is PASS  # values copied: the task
    for r in rows[::4]:
        r["text"] = f"{r['text']} {json.dumps(r['slots'])}"
    (tmp_path / "pasted.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    leak = audit(tmp_path, {**data, "file": "pasted.jsonl"}, "extraction")
    found = leak["answer written in the input"]
    assert found.verdict is FAIL and "pasted.jsonl:1" in found.sentence, found.sentence


def chat_rows(shared_data: Path, n: int, system: str | None) -> list[dict]:
    """sgd user turns as conversations: the user's turn, the structured answer."""
    lines = (shared_data / "sgd_user_turns" / "test.jsonl").read_text().splitlines()[:n]
    out = []
    for line in lines:
        row = json.loads(line)
        turns = [{"role": "system", "content": system}] if system else []
        turns += [{"role": "user", "content": row["text"]},
                  {"role": "assistant", "content": json.dumps(row["target"]["acts"])}]
        out.append({"messages": turns, "group": row["group_id"]})
    return out


CHAT = {"chat": {}, "fields": {"group": "group"}, "split": {"policy": "group"}}
SYSTEM = "You are the booking assistant of a travel agency. Answer with the dialogue acts."


@pytest.mark.realdata
def test_d2_d5_an_assistant_turn_repeating_the_user_turn_fails(
    shared_data: Path, tmp_path: Path
) -> None:
    rows = chat_rows(shared_data, 600, SYSTEM)
    (tmp_path / "clean.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert audit(tmp_path, {**CHAT, "file": "clean.jsonl"},
                 "format")["answer written in the input"].verdict is PASS  # fmt: skip
    for r in rows[::3]:  # an export that put the user's words in the answer column
        r["messages"][-1]["content"] = r["messages"][-2]["content"]
    (tmp_path / "echo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = audit(tmp_path, {**CHAT, "file": "echo.jsonl"}, "format")
    leak = found["answer written in the input"]
    assert leak.verdict is FAIL and "echo.jsonl:1" in leak.sentence, leak.sentence


# --------------------------------------------------------------------------------------------
# splits built alike (D3, D5)
# --------------------------------------------------------------------------------------------


@pytest.mark.realdata
def test_d3_d5_chat_evaluation_rows_without_the_training_system_prompt_fail(
    shared_data: Path, tmp_path: Path
) -> None:
    train, validation = chat_rows(shared_data, 400, SYSTEM), chat_rows(shared_data, 500, None)
    for name, rows in (("train", train), ("validation", validation[400:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    files = {"files": {"train": "train.jsonl", "validation": "validation.jsonl"},
             "chat": {}, "fields": {"group": "group"}}  # fmt: skip
    built = audit(tmp_path, files, "format")["rows built alike in every split"]
    assert built.verdict is FAIL, built.sentence
    assert "a system turn in 100% of training rows" in built.sentence
    assert "0% of validation rows" in built.sentence
    (tmp_path / "validation.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in chat_rows(shared_data, 500, SYSTEM)[400:]))
    alike = audit(tmp_path, files, "format")["rows built alike in every split"]
    assert alike.verdict is PASS, alike.sentence


@pytest.mark.realdata
def test_d3_d5_a_template_header_written_only_in_training_fails(
    shared_data: Path, tmp_path: Path
) -> None:
    rows = [json.loads(line) for line in
            (shared_data / "restaurant8k" / "test.jsonl").read_text().splitlines()]  # fmt: skip
    rows = random.Random(0).sample(rows, 600)
    data = {"files": {"train": "train.jsonl", "validation": "validation.jsonl"},
            "fields": {"target": "slots", "context": ["requested_slots"]}}  # fmt: skip
    train = [{**r, "text": f"### Request:\n{r['text']}"} for r in rows[:500]]
    for name, part in (("train", train), ("validation", rows[500:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    found = audit(tmp_path, data, "extraction")["rows built alike in every split"]
    assert found.verdict is FAIL and "the text begins `### request:`" in found.sentence
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:500]))
    assert audit(tmp_path, data, "extraction")["rows built alike in every split"].verdict is PASS


# --------------------------------------------------------------------------------------------
# special tokens written twice (D3, D5)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bos_adding_model(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Path:
    """The tiny Llama with a tokenizer that adds BOS itself, as Llama's does."""
    import shutil

    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("bos") / "model"
    shutil.copytree(tiny_llama_dir, folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)])
    tok.save_pretrained(folder)
    return folder


def token_campaign(root: Path, model: Path, template: str) -> Path:
    rows = [{"text": f"ticket {i}: my parcel is late",
             "answer": {"reply": f"sorry, it ships on day {i}", "tone": "calm"}}
            for i in range(40)]  # fmt: skip
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = json.dumps({
        "name": "tokens", "hypothesis": {"behaviour": "b", "task": "format"},
        "model": {"name_or_path": str(model)},
        "data": {"file": "rows.jsonl", "fields": {"target": "answer"}, "template": template,
                 "split": {"policy": "random"}}})  # fmt: skip
    (root / "campaign.yaml").write_text(text)
    return root / "campaign.yaml"


def token_finding(path: Path):
    from tunepilot.data.flow import audit_findings
    from tunepilot.data.workspace import Workspace

    _, findings = audit_findings(Workspace.open(path))
    return {f.check: f for f in findings}["special tokens written once"]


def test_d3_d5_a_bos_written_by_the_template_and_added_by_the_tokenizer_fails(
    bos_adding_model: Path, tmp_path: Path
) -> None:
    clean = token_finding(token_campaign(tmp_path, bos_adding_model, "Ticket: {text}\n"))
    assert clean.verdict is PASS, clean.sentence
    found = token_finding(token_campaign(tmp_path, bos_adding_model, "<s>Ticket: {text}\n"))
    assert found.verdict is FAIL, found.sentence
    assert "start with '<s>' twice" in found.sentence
    assert "training input and the evaluation prompt" in found.sentence
    assert "data.template" in found.sentence


def test_d3_d5_assistant_turns_that_already_end_with_eos_get_a_second_one_and_fail(
    tiny_chat_llama_dir: Path, tmp_path: Path
) -> None:
    """The chat template closes every assistant turn with eos_token; an export that left
    `</s>` at the end of the answers makes it two."""
    def write(eos: str) -> Path:
        rows = [{"messages": [{"role": "user", "content": f"where is parcel {i}?"},
                              {"role": "assistant", "content": f"it ships on day {i}" +
                               (eos if i % 2 else "")}]} for i in range(40)]  # fmt: skip
        (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (tmp_path / "campaign.yaml").write_text(json.dumps({
            "name": "eos", "hypothesis": {"behaviour": "b", "task": "format"},
            "model": {"name_or_path": str(tiny_chat_llama_dir)},
            "data": {"file": "chat.jsonl", "chat": {}, "split": {"policy": "random"}}}))
        return tmp_path / "campaign.yaml"

    assert token_finding(write("")).verdict is PASS
    found = token_finding(write("</s>"))
    assert found.verdict is FAIL and "answers end with '</s>' twice" in found.sentence
    assert len({i for i, _ in found.details["doubled_end"]}) == 20, found.details
