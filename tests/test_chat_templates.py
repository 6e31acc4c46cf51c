"""Real chat templates without `{% generation %}` tags, as instruct models ship them (D3, D5):
the prefix-diff way of locating assistant turns on Llama 3, ChatML, Phi-3, Zephyr and Gemma
templates, a template that refuses a conversation named by the row, a template that
rewrites earlier answers refused, and a broken template named as such.

The templates are the published ones (trimmed of tool-calling branches); they run on the tiny
chat Llama's tokenizer, whose special tokens include `</s>`, so a header such as `<|eot_id|>` is
plain text here: the locating logic is about characters, which is what it has to get right.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from test_chat_data import TWO_TURNS, chat_example, encoder_for, loss_pieces
from tunepilot.errors import InputError

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
CHATML = (
    "{%- for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{%- endfor %}{%- if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{%- endif %}"
)
PHI3 = (  # closes the conversation, not each turn, with EOS
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
    "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n'"
    " + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
)
GEMMA = (  # refuses a system turn and non-alternating roles
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("
    "'Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
    "{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + "
    "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{'<start_of_turn>model\n'}}{% endif %}"
)
DROPS_REASONING = (  # Qwen3-style: earlier answers lose their <think> part
    "{%- for message in messages %}{%- if message['role'] == 'assistant' and not loop.last %}"
    "{{'<|im_start|>assistant\n' + message['content'].split('</think>')[-1] + '<|im_end|>\n'}}"
    "{%- else %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>\n'}}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{%- endif %}"
)
NO_SYSTEM = TWO_TURNS[1:]


def _encoder(model: Path, template: str):
    encoder, _ = encoder_for(model, chat_template_jinja=template)
    encoder.max_length = 4096  # these headers are many byte-level tokens in the tiny vocabulary
    return encoder


@pytest.mark.parametrize(
    ("template", "turns", "ends"),
    [
        (LLAMA3, TWO_TURNS, ["<|eot_id|>", "<|eot_id|>"]),
        (CHATML, TWO_TURNS, ["<|im_end|>\n", "<|im_end|>\n"]),
        (PHI3, TWO_TURNS, ["<|end|>\n", "<|end|>\n</s>"]),
        (ZEPHYR, TWO_TURNS, ["</s>\n", "</s>\n"]),
        (GEMMA, NO_SYSTEM, ["<end_of_turn>\n", "<end_of_turn>\n"]),
    ],
    ids=["llama3", "chatml", "phi3", "zephyr", "gemma"],
)
def test_d5_prefix_diff_puts_the_loss_on_each_answer_and_its_end_of_turn(
    tiny_chat_llama_dir: Path, template: str, turns: list[dict[str, str]], ends: list[str]
) -> None:
    encoder = _encoder(tiny_chat_llama_dir, template)
    assert encoder.mask_method == "prefix diff"
    answers = [t["content"] for t in turns if t["role"] == "assistant"]
    pieces = loss_pieces(encoder, chat_example(turns))
    assert pieces == [a + end for a, end in zip(answers, ends, strict=True)]
    prompt = encoder.render_prompt(chat_example(turns))
    assert "you are welcome" not in prompt and "it ships today" in prompt


def test_d5_a_template_that_refuses_a_conversation_names_the_row_and_its_message(
    tiny_chat_llama_dir: Path,
) -> None:
    encoder = _encoder(tiny_chat_llama_dir, GEMMA)
    with pytest.raises(InputError) as err:
        encoder.encode(chat_example(TWO_TURNS))  # a system turn: Gemma's template raises
    [problem] = err.value.problems
    assert problem.where == "chat.jsonl:1"
    assert "System role not supported" in problem.found and "system" in problem.found
    assert "fold a system turn into the first user turn" in problem.fix
    with pytest.raises(InputError):  # the evaluation prompt goes through the same door
        encoder.render_prompt(chat_example(TWO_TURNS))


def test_d5_a_template_that_rewrites_earlier_answers_is_refused_not_mismasked(
    tiny_chat_llama_dir: Path,
) -> None:
    turns = [dict(t) for t in TWO_TURNS]
    turns[2]["content"] = "<think>look it up</think>it ships today"
    encoder = _encoder(tiny_chat_llama_dir, DROPS_REASONING)
    assert len(loss_pieces(encoder, chat_example(TWO_TURNS))) == 2  # no reasoning: fine
    with pytest.raises(InputError) as err:
        encoder.encode(chat_example(turns))
    [problem] = err.value.problems
    assert problem.where == "chat.jsonl:1 (turn 3)" and "{% generation %}" in problem.fix


def test_d5_a_chat_template_that_is_not_jinja_is_named_with_its_line(
    tiny_chat_llama_dir: Path,
) -> None:
    encoder = _encoder(tiny_chat_llama_dir, "{% for m in messages %}{{ m['content'] }")
    with pytest.raises(InputError) as err:
        encoder.encode(chat_example())
    [problem] = err.value.problems
    assert problem.where == "data.chat.chat_template_jinja"
    assert "not valid Jinja (line 1" in problem.found


def test_d3_d5_data_show_without_colour_brackets_exactly_the_assistant_turns(
    tiny_chat_llama_dir: Path,
) -> None:
    """A pipe, a log or the pilot's samples.txt has no colour: the loss positions are then
    bracketed, one pair per trained turn, and a line breaks between tokens, never inside one."""
    import io
    import re

    from rich.console import Console

    from tunepilot.data.inspect import print_samples, render_samples, visible

    for turns, trained in (("all", ["it ships today</s>", "you are welcome</s>"]),
                           ("last", ["you are welcome</s>"])):  # fmt: skip
        encoder, _ = encoder_for(tiny_chat_llama_dir, assistant_turns=turns)
        samples = render_samples(encoder, encoder.tokenizer, [chat_example()], n=1)
        buf = io.StringIO()
        print_samples(samples, Console(file=buf, width=40, color_system=None))
        text = buf.getvalue()
        stream = text.split("\n\n")[0].split("\n", 1)[1]  # the token lines after the header
        lines = stream.split("\nloss on")[0].split("\n")
        assert all(len(line) <= 40 for line in lines)
        one_line = "".join(lines)  # a break replaces nothing: the next line starts with `|`
        pieces = [visible(t["token"]) for t in samples[0].tokens]
        assert one_line.replace("⟦", "").replace("⟧", "") == "|".join(pieces)
        bounds, at = set(), 0
        for piece in pieces:
            at += len(piece) + 1
            bounds.add(at - 1)  # the offset of the separator after this token
        breaks = [sum(len(x) for x in lines[: k + 1]) for k in range(len(lines) - 1)]
        unmarked = [len(one_line[:b].replace("⟦", "").replace("⟧", "")) for b in breaks]
        assert breaks and set(unmarked) <= bounds  # every break falls before a separator
        marked = re.findall(r"⟦(.*?)⟧", "".join(lines).replace("|", ""))
        assert [m.replace("␣", " ") for m in marked] == trained
        assert "(inside ⟦ ⟧)" in text and "⟦...⟧ loss" in text
        said = " ".join(text.split())  # Rich folds the line at width 40
        assert "expected (the last assistant turn, what evaluation scores): you are welcome" in said


def test_d5_the_audit_reports_rows_the_template_refuses_instead_of_stopping(
    tiny_chat_llama_dir: Path,
) -> None:
    from tunepilot.campaign.schema import AuditSettings
    from tunepilot.data.audit.chat import check_turn_end
    from tunepilot.data.audit.labels import check_lengths
    from tunepilot.verdict import Verdict

    encoder = _encoder(tiny_chat_llama_dir, GEMMA)
    refused = chat_example(TWO_TURNS)
    fine = dataclasses.replace(chat_example(NO_SYSTEM), id="c2", source="chat.jsonl:2")
    splits = {"train": [refused], "validation": [], "test": []}
    assert "cannot validate" in check_turn_end(splits, encoder).sentence  # and no crash
    splits["train"].append(fine)
    ends = check_turn_end(splits, encoder)  # judged on the row that encodes
    assert ends.examples == ["c2"] and "not with the tokenizer's EOS" in ends.sentence
    lengths = check_lengths(splits, encoder, "format", 4096, AuditSettings())
    assert lengths.verdict is Verdict.FAIL and "System role not supported" in lengths.sentence


def test_d5_content_that_is_not_a_string_is_named_with_the_fix_for_its_shape(
    tiny_chat_llama_dir: Path, tmp_path: Path
) -> None:
    from test_chat_data import campaign, write_rows
    from tunepilot.data.load import load_file

    user = {"role": "user", "content": "hi"}
    parts = [{"type": "text", "text": "ok"}]
    path = write_rows(tmp_path / "chat.jsonl", [
        {"messages": [user, {"role": "assistant", "content": parts}]},
        {"messages": [user, {"role": "assistant", "content": 42}]},
    ])  # fmt: skip
    with pytest.raises(InputError) as err:
        load_file(path, campaign(tiny_chat_llama_dir).data, "format")
    first, second = err.value.problems
    assert first.where == f"{path}:1 messages[1]" and "has a list as `content`" in first.found
    assert "join the text parts into one string" in first.fix
    assert second.where == f"{path}:2 messages[1]" and "has an int as `content`" in second.found
    assert "give it text in `content`" in second.fix
