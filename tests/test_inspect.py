"""`data show` rendering: tokens, separators, truncation and loss positions (D3, D4, D5)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from tunepilot.data.inspect import print_samples, render_samples, samples_to_json
from tunepilot.errors import InputError
from tunepilot.tasks.classification import ClassificationEncoder
from tunepilot.tasks.example import Example
from tunepilot.tasks.generation import GenerationEncoder

TEMPLATE = "Text: {text}\nJSON: "


@pytest.fixture(scope="module")
def tok(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def gen_examples() -> list[Example]:
    return [
        Example(id=f"x{i}", text=t, source=f"d.jsonl:{i}", target={"order_id": o})
        for i, (t, o) in enumerate([("my order 12345", "12345"), ("order 88812 please", "88812")])
    ]


def cls_examples() -> list[Example]:
    rows = [
        ("c3", "refund"),
        ("c1", "cancel"),
        ("c2", "refund"),
        ("c0", "refund"),
        ("c4", "cancel"),
    ]
    return [
        Example(id=i, text=f"text {i}", source=f"d.jsonl:{n}", label=lab)
        for n, (i, lab) in enumerate(rows)
    ]


def render(samples) -> str:
    buf = io.StringIO()
    print_samples(samples, Console(file=buf, width=200, color_system=None))
    return buf.getvalue()


def test_d3_json_marks_only_answer_positions_as_loss(tok):
    enc = GenerationEncoder(tok, TEMPLATE, max_length=128)
    samples = render_samples(enc, tok, gen_examples(), n=2)
    data = json.loads(json.dumps(samples_to_json(samples)))
    assert [s["id"] for s in data] == ["x0", "x1"]
    for s, example in zip(data, gen_examples(), strict=True):
        prompt_len = len(tok(TEMPLATE.format(text=example.text))["input_ids"])
        flags = [t["loss"] for t in s["tokens"]]
        assert flags == [False] * prompt_len + [True] * (len(flags) - prompt_len)
        loss_ids = [t["id"] for t in s["tokens"] if t["loss"]]
        assert tok.decode(loss_ids) == s["expected"] + "</s>"
        assert s["n_loss_tokens"] == len(loss_ids)
        assert s["truncated"] is False and s["truncation_point"] is None
    assert data[0]["expected"] == '{"order_id":"12345"}'
    assert data[0]["tokens"][-1]["token"] == "</s>"  # special tokens stay visible


def test_d3_truncation_point_and_scissors(tok):
    enc = GenerationEncoder(tok, TEMPLATE, max_length=10)
    (sample,) = render_samples(enc, tok, gen_examples()[:1], n=1)
    assert sample.truncated and sample.truncation_point == 10 == len(sample.tokens)
    assert sample.full_length > 10
    text = render([sample])
    assert "✂" in text and f"({sample.full_length - 10} more token(s) cut" in text
    assert "⏎" in text  # the newline in the template is visible
    assert "|" in text


def test_d3_printed_view_shows_expected_target(tok):
    enc = GenerationEncoder(tok, TEMPLATE, max_length=128)
    text = render(render_samples(enc, tok, gen_examples(), n=1))
    assert 'expected: {"order_id":"12345"}' in text
    assert "loss on" in text and "x0" in text


def test_d4_per_class_picks_first_k_in_id_order(tok):
    enc = ClassificationEncoder(tok, ["refund", "cancel"], max_length=32)
    samples = render_samples(enc, tok, cls_examples(), per_class=2)
    assert [(s.label, s.id) for s in samples] == [
        ("refund", "c0"),
        ("refund", "c2"),
        ("cancel", "c1"),
        ("cancel", "c4"),
    ]
    assert all(s.n_loss_tokens == 1 for s in samples)
    assert all(not t["loss"] for s in samples for t in s.tokens)
    assert samples[2].loss_on_label == "cancel (id 1)"
    assert "loss on label: cancel (id 1)" in render(samples)


def test_d4_per_class_without_labels_is_an_input_error(tok):
    enc = GenerationEncoder(tok, TEMPLATE, max_length=128)
    with pytest.raises(InputError, match="per class"):
        render_samples(enc, tok, gen_examples(), per_class=1)
