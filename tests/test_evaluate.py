"""The one evaluation procedure (H3, V2) on the tiny real Llama and BERT."""

from __future__ import annotations

import json
import math

import pytest

from tunepilot.errors import InputError
from tunepilot.experiments.evaluate import evaluate
from tunepilot.tasks.classification import ClassificationEncoder
from tunepilot.tasks.example import Example
from tunepilot.tasks.generation import GenerationEncoder

LABELS = ["refund", "delivery", "cancel"]
SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}},
    "required": ["order_id"],
}


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir), AutoTokenizer.from_pretrained(
        tiny_llama_dir
    )


@pytest.fixture(scope="module")
def bert(tiny_bert_dir):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_bert_dir, num_labels=len(LABELS)
    )
    return model, AutoTokenizer.from_pretrained(tiny_bert_dir)


def cls_examples() -> list[Example]:
    texts = [
        ("please refund 19.99 for the kettle", "refund"),
        ("where is my order 12345", "delivery"),
        ("cancel my subscription please", "cancel"),
        ("I was charged twice, refund please", "refund"),
        ("how do I change the delivery address for order 88812?", "delivery"),
    ]
    return [
        Example(id=f"c{i}", text=t, source=f"v.jsonl:{i}", label=lab)
        for i, (t, lab) in enumerate(texts)
    ]


def gen_examples() -> list[Example]:
    texts = ["my order 12345 has not arrived", "order 88812", "the laptop stand is broken"]
    return [
        Example(id=f"g{i}", text=t, source=f"v.jsonl:{i}", target={"order_id": str(i)})
        for i, t in enumerate(texts)
    ]


def test_h3_classification_eval_keeps_per_example_predictions(bert):
    model, tok = bert
    enc = ClassificationEncoder(tok, LABELS, max_length=32)
    model.train()
    result = evaluate(model, enc, cls_examples(), batch_size=2, max_new_tokens=8)
    assert model.training  # mode restored
    assert len(result.rows) == 5
    row = result.rows[0]
    assert set(row) >= {"id", "gold", "pred", "correct", "logits"}
    assert len(row["logits"]) == 3 and row["pred"] in LABELS
    assert row["correct"] == (row["pred"] == row["gold"])
    m = result.metrics
    assert set(m["per_class"]) == set(LABELS)
    assert m["accuracy"] == sum(r["correct"] for r in result.rows) / 5
    assert math.isfinite(m["loss"]) and m["loss"] > 0
    json.dumps({"m": m, "rows": result.rows, "c": result.config})  # all JSON-ready


def test_v2_evaluation_is_deterministic_and_batch_size_independent_in_predictions(bert):
    model, tok = bert
    enc = ClassificationEncoder(tok, LABELS, max_length=32)
    a = evaluate(model, enc, cls_examples(), batch_size=2, max_new_tokens=8)
    b = evaluate(model, enc, cls_examples(), batch_size=2, max_new_tokens=8)
    c = evaluate(model, enc, cls_examples(), batch_size=5, max_new_tokens=8)
    assert a.rows == b.rows and a.metrics == b.metrics and a.config_hash == b.config_hash
    assert [r["pred"] for r in a.rows] == [r["pred"] for r in c.rows]
    for ra, rc in zip(a.rows, c.rows, strict=True):  # right padding is masked
        assert ra["logits"] == pytest.approx(rc["logits"], abs=1e-5)
    assert a.config_hash != c.config_hash  # the batch size is part of the procedure


def test_v2_config_hash_changes_with_the_split_and_the_scoring_not_the_encoding(bert):
    model, tok = bert
    enc = ClassificationEncoder(tok, LABELS, max_length=32)
    base = evaluate(model, enc, cls_examples(), batch_size=2, max_new_tokens=8)
    fewer = evaluate(model, enc, cls_examples()[:4], batch_size=2, max_new_tokens=8)
    longer = evaluate(
        model,
        ClassificationEncoder(tok, LABELS, max_length=64),
        cls_examples(),
        batch_size=2,
        max_new_tokens=8,
    )
    assert base.config_hash != fewer.config_hash
    # another max_length is another encoding of the same examples, judged by compare (S6)
    assert longer.config_hash == base.config_hash
    assert longer.config["encoding"]["max_length"] == 64 != base.config["encoding"]["max_length"]
    assert base.config["scored_against"]["labels"] == LABELS
    assert base.config["split_ids_hash"] != fewer.config["split_ids_hash"]
    assert base.metrics["answers_cut"] == 0  # a class id is never cut


def test_d6_head_size_mismatch_is_refused(bert):
    model, tok = bert
    enc = ClassificationEncoder(tok, ["a", "b"], max_length=32)
    examples = [Example(id="x", text="t", source="v:1", label="a")]
    with pytest.raises(InputError, match="2 classes"):
        evaluate(model, enc, examples, batch_size=1, max_new_tokens=4)


def test_h3_extraction_eval_generates_greedily_and_scores(llama):
    model, tok = llama
    enc = GenerationEncoder(
        tok, "Text: {text}\nJSON: ", max_length=64, required_fields=["order_id"], schema=SCHEMA
    )
    a = evaluate(model, enc, gen_examples(), batch_size=2, max_new_tokens=6)
    b = evaluate(model, enc, gen_examples(), batch_size=2, max_new_tokens=6)
    assert not model.training
    assert len(a.rows) == 3 and [r["id"] for r in a.rows] == ["g0", "g1", "g2"]
    assert a.rows == b.rows and a.config_hash == b.config_hash  # greedy = deterministic
    for key in (
        "json_validity",
        "schema_validity",
        "required_field_presence",
        "per_field",
        "loss",
        "stopped_at_eos",
    ):
        assert key in a.metrics
    assert math.isfinite(a.metrics["loss"])
    assert a.config["decoding"] == "greedy" and a.config["max_new_tokens"] == 6
    row = a.rows[0]
    assert set(row) >= {"id", "output", "gold", "valid_json", "schema_ok", "fields_present"}
    assert row["gold"] == {"order_id": "0"}
    # each output is cut at max_new_tokens or EOS and decoded without special tokens
    for r in a.rows:
        assert "</s>" not in r["output"] and "<pad>" not in r["output"]
        assert r["output_tokens"] == 6 or r["stopped_at_eos"]
        assert r["output_tokens"] <= 6


def test_h3_batched_generation_matches_one_by_one(llama):
    model, tok = llama
    enc = GenerationEncoder(tok, "Text: {text}\nJSON: ", max_length=64)
    batched = evaluate(model, enc, gen_examples(), batch_size=3, max_new_tokens=6)
    single = evaluate(model, enc, gen_examples(), batch_size=1, max_new_tokens=6)
    assert [r["output"] for r in batched.rows] == [r["output"] for r in single.rows]
    assert batched.metrics["loss"] == pytest.approx(single.metrics["loss"], rel=1e-5)


def test_h3_empty_split_is_an_input_error(llama):
    model, tok = llama
    with pytest.raises(InputError):
        evaluate(model, GenerationEncoder(tok, "{text}", max_length=32), [], 1, 4)
