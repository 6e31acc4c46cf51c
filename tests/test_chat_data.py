"""Chat-format data (H1 response format, D3, D5): conversation rows in the TRL/Axolotl shape or
ShareGPT's, rendered with the tokenizer's own chat template, loss on assistant turns only,
bad rows refused by file:line, and the audit treating a conversation as one unit.

Runs on the tiny chat Llama (BPE trained on the fly + a `{% generation %}` template); a second,
tag-free ChatML-style template exercises the prefix-diff way of locating turns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tunepilot.campaign import validate_mapping
from tunepilot.data.load import load_file
from tunepilot.errors import InputError
from tunepilot.tasks import make_encoder
from tunepilot.tasks.base import IGNORE_INDEX
from tunepilot.tasks.example import Example

TAGLESS = (
    "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + "
    "eos_token + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}"
    "{% endif %}"
)
TWO_TURNS = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "where is my order 12345?"},
    {"role": "assistant", "content": "it ships today"},
    {"role": "user", "content": "thanks"},
    {"role": "assistant", "content": "you are welcome"},
]


def campaign(model: Path, file: str = "chat.jsonl", **chat: Any):
    return validate_mapping(
        {
            "name": "chat",
            "hypothesis": {"behaviour": "answer in the house style", "task": "format"},
            "model": {"name_or_path": str(model)},
            "data": {"file": file, "chat": chat, "max_length": 128},
        }
    )


def write_rows(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def encoder_for(model: Path, **chat: Any):
    from transformers import AutoTokenizer

    c = campaign(model, **chat)
    return make_encoder(c, AutoTokenizer.from_pretrained(str(model)), []), c


def chat_example(turns: list[dict[str, str]] = TWO_TURNS) -> Example:
    return Example(id="c1", text="", source="chat.jsonl:1", target=turns[-1]["content"],
                   messages=turns)  # fmt: skip


def loss_pieces(encoder: Any, example: Example) -> list[str]:
    """The decoded text of each run of loss-carrying positions."""
    enc = encoder.encode(example)
    runs: list[list[int]] = []
    for k, label in enumerate(enc.labels):
        if label == IGNORE_INDEX:
            continue
        assert label == enc.input_ids[k]
        if runs and enc.labels[k - 1] != IGNORE_INDEX:
            runs[-1].append(label)
        else:
            runs.append([label])
    return [encoder.tokenizer.decode(r, skip_special_tokens=False) for r in runs]


def test_d5_chat_loss_falls_on_every_assistant_turn_and_its_eos_from_generation_tags(
    tiny_chat_llama_dir: Path,
) -> None:
    encoder, _ = encoder_for(tiny_chat_llama_dir)
    assert encoder.mask_method == "generation tags"
    assert loss_pieces(encoder, chat_example()) == ["it ships today</s>", "you are welcome</s>"]
    enc = encoder.encode(chat_example())
    rendered = encoder.tokenizer.apply_chat_template(TWO_TURNS, tokenize=False)
    assert encoder.tokenizer.decode(enc.input_ids, skip_special_tokens=False) == rendered


def test_d5_chat_last_turn_only_masks_the_earlier_answers(tiny_chat_llama_dir: Path) -> None:
    encoder, _ = encoder_for(tiny_chat_llama_dir, assistant_turns="last")
    assert loss_pieces(encoder, chat_example()) == ["you are welcome</s>"]
    prompt = encoder.render_prompt(chat_example())
    assert prompt.endswith("thanks</s>\n<|assistant|>\n") and "it ships today" in prompt


def test_d5_tagless_template_locates_turns_by_prefix_diff_with_the_same_answers(
    tiny_chat_llama_dir: Path,
) -> None:
    encoder, _ = encoder_for(tiny_chat_llama_dir, chat_template_jinja=TAGLESS)
    assert encoder.mask_method == "prefix diff"
    assert loss_pieces(encoder, chat_example()) == [
        "it ships today</s>\n",
        "you are welcome</s>\n",
    ]
    assert encoder.describe()["loss_mask_method"] == "prefix diff"


def test_d5_truncation_names_the_assistant_turn_it_cuts(tiny_chat_llama_dir: Path) -> None:
    encoder, _ = encoder_for(tiny_chat_llama_dir)
    full = encoder.encode(chat_example()).full_length
    encoder.max_length = full - 3  # inside the last answer
    enc = encoder.encode(chat_example())
    assert (enc.truncated, enc.target_truncated, enc.cut_turns) == (True, True, [2])
    assert len(enc.input_ids) == full - 3


def test_d5_a_tokenizer_without_chat_template_and_none_declared_is_refused_with_the_fix(
    tiny_llama_dir: Path,
) -> None:
    with pytest.raises(InputError) as err:
        encoder_for(tiny_llama_dir)
    problem = err.value.problems[0]
    assert problem.where == "data.chat.chat_template_jinja"
    assert "no chat template" in problem.found and "chat_template" in problem.fix


def test_h1_sharegpt_rows_map_to_the_same_turns_as_messages_rows(
    tiny_chat_llama_dir: Path, tmp_path: Path
) -> None:
    who = {"system": "system", "user": "human", "assistant": "gpt"}
    share = [{"from": who[t["role"]], "value": t["content"]} for t in TWO_TURNS]
    write_rows(tmp_path / "share.jsonl", [{"conversations": share, "id": "x"}])
    write_rows(tmp_path / "msgs.jsonl", [{"messages": TWO_TURNS, "id": "x"}])
    c_share = campaign(
        tiny_chat_llama_dir,
        field_messages="conversations",
        message_property_mappings={"role": "from", "content": "value"},
    )
    c_msgs = campaign(tiny_chat_llama_dir)
    [a] = load_file(tmp_path / "share.jsonl", c_share.data, "format")
    [b] = load_file(tmp_path / "msgs.jsonl", c_msgs.data, "format")
    assert a.messages == b.messages == TWO_TURNS
    assert (
        a.target == "you are welcome" and a.text == "be brief\n\nwhere is my order 12345?\n\nthanks"
    )


def test_d5_bad_chat_rows_are_named_by_file_line_with_the_fix(
    tiny_chat_llama_dir: Path, tmp_path: Path
) -> None:
    user = {"role": "user", "content": "hi"}
    rows = [
        {"messages": [user, {"content": "no role"}]},  # line 1: missing role
        {"messages": [user, {"role": "assistant", "content": "  "}]},  # 2: empty answer
        {"messages": [user, {"role": "assistant", "content": "ok"}, user]},  # 3: ends on user
        {"messages": [user, {"role": "robot", "content": "ok"}]},  # 4: unknown role
        {"messages": "hi"},  # 5: not a list
        {"messages": [user, {"role": "assistant", "content": "fine"}]},  # 6: good
    ]
    path = write_rows(tmp_path / "chat.jsonl", rows)
    data = campaign(tiny_chat_llama_dir, assistant_turns="last").data
    with pytest.raises(InputError) as err:
        load_file(path, data, "format")
    found = {p.where.split(" ")[0]: p for p in err.value.problems}
    assert sorted(found) == [f"{path}:{n}" for n in range(1, 6)]
    assert "has no `role`" in found[f"{path}:1"].found
    assert "empty `content`" in found[f"{path}:2"].found
    assert "ends on a user turn" in found[f"{path}:3"].found
    assert "end the row with the assistant's answer" in found[f"{path}:3"].fix
    assert "`robot`" in found[f"{path}:4"].found and "data.chat.roles" in found[f"{path}:4"].fix
    assert "not a list of turns" in found[f"{path}:5"].found
    assert all(p.fix for p in err.value.problems)


def test_d5_a_trailing_user_turn_is_kept_when_every_assistant_turn_is_trained(
    tiny_chat_llama_dir: Path, tmp_path: Path
) -> None:
    turns = [*TWO_TURNS, {"role": "user", "content": "bye"}]
    path = write_rows(tmp_path / "chat.jsonl", [{"messages": turns}])
    [ex] = load_file(path, campaign(tiny_chat_llama_dir).data, "format")
    assert ex.messages == turns and ex.target == "you are welcome"


def test_d1_cleaning_touches_user_turns_never_answers(
    tiny_chat_llama_dir: Path,
) -> None:
    from tunepilot.data.clean import clean

    turns = [{"role": "user", "content": "  WHERE   is it? "},
             {"role": "assistant", "content": "  Here   IT is "}]  # fmt: skip
    ex = Example(id="a", text="", source="f:1", target=turns[-1]["content"], messages=turns)
    [out], _ = clean([ex], ["strip", "collapse_whitespace", "lowercase"])
    assert out.messages == [{"role": "user", "content": "where is it?"}, turns[1]]
    assert out.text == "where is it?"


def conversation(i: int, question: str | None = None, answer: str | None = None) -> dict:
    return {
        "id": f"c{i}",
        "messages": [
            {"role": "user", "content": question or f"where is my order {10000 + i * 7}?"},
            {"role": "assistant", "content": answer or f"order {10000 + i * 7} ships today"},
            {"role": "user", "content": "and the refund?"},
            {"role": "assistant", "content": f"refund {i} is on its way"},
        ],
    }


def test_d2_d8_audit_treats_a_conversation_as_one_unit_and_finds_rows_cut_from_one(
    tiny_chat_llama_dir: Path, tmp_path: Path
) -> None:
    """Whole-conversation copies and same-user-turns copies across splits FAIL separately,
    and a max_length that cuts assistant turns is reported turn by turn."""
    import yaml

    from tunepilot.data.flow import audit_findings
    from tunepilot.data.workspace import Workspace
    from tunepilot.verdict import Verdict

    train = [conversation(i) for i in range(8)]
    same_questions = conversation(20, train[1]["messages"][0]["content"], "another wording")
    same_questions["messages"][3] = train[1]["messages"][3]
    copy = {**train[2], "id": "c21"}
    validation = [conversation(i) for i in range(10, 14)] + [same_questions, copy]
    write_rows(tmp_path / "train.jsonl", train)
    cut_row = {"id": "c22", "messages": train[3]["messages"][:2]}  # a row cut from c3
    write_rows(tmp_path / "validation.jsonl", [*validation, cut_row])
    spec = {
        "name": "chat-audit",
        "hypothesis": {"behaviour": "answer order questions", "task": "format"},
        "model": {"name_or_path": str(tiny_chat_llama_dir)},
        "data": {
            "files": {"train": "train.jsonl", "validation": "validation.jsonl"},
            "fields": {"id": "id"},
            "chat": {},
            "max_length": 50,
        },
    }
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    _, findings = audit_findings(Workspace.open(tmp_path / "campaign.yaml"))
    by = {f.check: f for f in findings}
    across = by["exact duplicates across splits"]
    assert across.verdict is Verdict.FAIL and across.examples == ["c21"]
    asked = by["same user turns across splits"]
    assert asked.verdict is Verdict.FAIL and asked.details["pairs"] == [
        ("c20", "c1"),
        ("c21", "c2"),
    ]
    opening = by["conversations cut into rows"]
    assert opening.verdict is Verdict.WARN and opening.details["pairs"] == [("c22", "c3")]
    lengths = by["length and truncation"]
    assert lengths.verdict is Verdict.FAIL
    assert "assistant turn 2" in lengths.sentence
    cut = lengths.details["cut_turns"]
    assert len(cut) == len(train) + len(validation) and {n for _, n in cut} == {2}


def test_d5_bad_chat_rows_exit_2_from_the_cli_naming_file_line(
    tiny_chat_llama_dir: Path, tmp_path: Path
) -> None:
    import subprocess
    import sys

    import yaml

    user = {"role": "user", "content": "hi"}
    write_rows(tmp_path / "chat.jsonl", [
        {"messages": [user, {"role": "assistant", "content": "fine"}]},
        {"messages": [user, {"role": "assistant"}]},
    ])  # fmt: skip
    spec = {"name": "bad-chat", "hypothesis": {"behaviour": "b", "task": "format"},
            "model": {"name_or_path": str(tiny_chat_llama_dir)},
            "data": {"file": "chat.jsonl", "chat": {}}}  # fmt: skip
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "tunepilot.cli", "data", "show", str(tmp_path / "campaign.yaml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"{tmp_path / 'chat.jsonl'}:2 messages[1]" in done.stderr.replace("\n", "")
    assert "turn 2 (assistant) has no `content`" in done.stderr and "Traceback" not in done.stderr


def test_d5_a_template_that_ends_turns_without_eos_warns_that_generation_never_stops(
    tiny_chat_llama_dir: Path,
) -> None:
    from tunepilot.data.audit.chat import check_turn_end
    from tunepilot.verdict import Verdict

    splits = {"train": [chat_example()], "validation": [], "test": []}
    encoder, _ = encoder_for(tiny_chat_llama_dir)
    assert check_turn_end(splits, encoder).verdict is Verdict.PASS
    sep_closed = TAGLESS.replace("eos_token", "sep_token")
    encoder, _ = encoder_for(tiny_chat_llama_dir, chat_template_jinja=sep_closed)
    finding = check_turn_end(splits, encoder)
    assert finding.verdict is Verdict.WARN
    assert "not with the tokenizer's EOS '</s>'" in finding.sentence
    assert "max_new_tokens" in finding.sentence
