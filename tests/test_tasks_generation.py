"""Generation encoding with the loss mask (D5, S6) and extraction/format metrics (H2)."""

from __future__ import annotations

import json

import pytest

from tunepilot.campaign import validate_mapping
from tunepilot.errors import InputError
from tunepilot.tasks import make_encoder
from tunepilot.tasks.base import IGNORE_INDEX
from tunepilot.tasks.classification import ClassificationEncoder
from tunepilot.tasks.example import Example
from tunepilot.tasks.generation import GenerationEncoder, canonical_answer
from tunepilot.tasks.metrics import extraction_metrics, format_metrics, schema_errors
from tunepilot.verdict import Verdict

TEMPLATE = "Extract the order as JSON.\nText: {text}\nJSON: "
TARGET = {"order_id": "12345", "product": "kettle", "amount": 19.99}


@pytest.fixture()
def tok(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def ex(i: int = 1, text: str = "I was charged twice for order 12345", target=TARGET, **ctx):
    return Example(id=f"g{i}", text=text, source=f"train.jsonl:{i}", target=target, context=ctx)


def test_d5_prompt_positions_are_masked_answer_and_eos_carry_loss(tok):
    enc = GenerationEncoder(tok, TEMPLATE, max_length=256)
    example = ex()
    out = enc.encode(example)
    prompt = tok(TEMPLATE.format(text=example.text))["input_ids"]
    answer = tok(json.dumps(TARGET, separators=(",", ":")), add_special_tokens=False)["input_ids"]
    assert out.input_ids == prompt + answer + [tok.eos_token_id]
    assert out.prompt_length == len(prompt)
    assert out.labels[: len(prompt)] == [IGNORE_INDEX] * len(prompt)
    assert out.labels[len(prompt) :] == answer + [tok.eos_token_id]
    assert out.loss_tokens == len(answer) + 1
    assert tok.decode(out.labels[len(prompt) :]) == canonical_answer(TARGET) + "</s>"
    assert not out.truncated and not out.target_truncated


def test_d5_mask_prompt_off_puts_loss_everywhere(tok):
    out = GenerationEncoder(tok, TEMPLATE, max_length=256, mask_prompt=False).encode(ex())
    assert out.labels == out.input_ids
    assert IGNORE_INDEX not in out.labels


def test_d5_canonical_answer_keeps_key_order_and_unicode():
    assert canonical_answer({"b": 1, "a": "Cita Romántica"}) == '{"b":1,"a":"Cita Romántica"}'


def test_s6_truncation_that_cuts_the_answer_is_flagged(tok):
    enc = GenerationEncoder(tok, TEMPLATE, max_length=256)
    full = enc.encode(ex())
    n_prompt = full.prompt_length
    cut = GenerationEncoder(tok, TEMPLATE, max_length=n_prompt + 3).encode(ex())
    assert cut.input_ids == full.input_ids[: n_prompt + 3]
    assert cut.truncated and cut.target_truncated
    assert cut.full_length == len(full.input_ids)
    assert cut.loss_tokens == 3
    assert tok.eos_token_id not in cut.labels


def _lengths(encoder, *examples):
    """The audit's length check (D3, S6) on a training split of `examples`."""
    from tunepilot.campaign.schema import AuditSettings
    from tunepilot.data.audit.labels import check_lengths

    return check_lengths({"train": list(examples)}, encoder, "extraction", encoder.max_length,
                         AuditSettings())  # fmt: skip


def test_d5_zero_loss_tokens_fail_naming_ids(tok):
    ok = GenerationEncoder(tok, TEMPLATE, max_length=256)
    tight = GenerationEncoder(tok, TEMPLATE, max_length=8)  # the prompt fills max_length
    assert tight.encode(ex(2)).loss_tokens == 0
    fail = _lengths(tight, ex(2), ex(3))
    assert fail.verdict is Verdict.FAIL
    assert fail.examples == ["g2", "g3"]
    assert "g2" in fail.sentence and "2 examples lose answer tokens" in fail.sentence
    assert _lengths(ok, ex(1)).verdict is Verdict.PASS


def test_s6_partly_cut_answer_fails_as_another_experiment(tok):
    n_prompt = GenerationEncoder(tok, TEMPLATE, max_length=256).encode(ex()).prompt_length
    encoder = GenerationEncoder(tok, TEMPLATE, max_length=n_prompt + 2)
    assert 0 < encoder.encode(ex(4)).loss_tokens < len(encoder.encode(ex(4)).labels)
    finding = _lengths(encoder, ex(4))
    assert finding.verdict is Verdict.FAIL and finding.examples == ["g4"]
    assert "not the same experiment" in finding.sentence


def test_d5_chat_template_is_used_when_the_tokenizer_has_one(tok):
    tok.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    enc = GenerationEncoder(tok, "Q: {text}", max_length=256)
    example = ex(text="cancel my order")
    assert enc.render_prompt(example) == "<s>user: Q: cancel my order\nassistant: "
    out = enc.encode(example)
    assert out.input_ids[0] == tok.bos_token_id
    assert out.input_ids[: out.prompt_length] == enc.prompt_ids(example)
    assert out.labels[out.prompt_length :][-1] == tok.eos_token_id
    assert enc.describe()["chat_template_hash"] is not None


def test_d3_template_context_fields_and_errors(tok):
    enc = GenerationEncoder(tok, "slots {requested}: {text}\n", max_length=256)
    example = ex(text="5 people", requested=["people"])
    assert enc.render_prompt(example) == 'slots ["people"]: 5 people\n'
    with pytest.raises(InputError, match="requested"):
        enc.encode(ex(text="5 people"))
    with pytest.raises(InputError, match="text"):
        GenerationEncoder(tok, "no field here", max_length=64)
    with pytest.raises(InputError, match="braces"):
        GenerationEncoder(tok, "bad { brace {text}", max_length=64)


def test_h1_format_task_answer_is_the_target_string(tok):
    enc = GenerationEncoder(tok, "{text}\n", max_length=128, task="format")
    example = ex(text="hi", target="Dear customer,\nthanks.")
    assert enc.expected_target(example) == "Dear customer,\nthanks."
    with pytest.raises(InputError, match="no target"):
        enc.encode(ex(target=None))


def test_extraction_target_must_be_a_json_object(tok):
    enc = GenerationEncoder(tok, TEMPLATE, max_length=128)
    assert enc.expected_target(ex(target='{"a": 1}')) == '{"a":1}'
    with pytest.raises(InputError, match="not an object"):
        enc.encode(ex(target=[1, 2]))


def _campaign(task: str, **data):
    raw = {
        "name": "t",
        "hypothesis": {"behaviour": "b", "task": task, "required_fields": ["order_id"]},
        "model": {"name_or_path": "x"},
        "data": {"file": "d.jsonl", "fields": {"label": "label", "target": "target"}, **data},
    }
    return validate_mapping(raw)


def test_make_encoder_picks_by_task(tok):
    gen = make_encoder(_campaign("extraction", max_length=99, mask_prompt=False), tok, [])
    assert isinstance(gen, GenerationEncoder)
    assert gen.max_length == 99 and gen.mask_prompt is False and gen.task == "extraction"
    assert gen.required_fields == ["order_id"]
    assert make_encoder(_campaign("format"), tok, []).task == "format"
    cls = make_encoder(_campaign("classification"), tok, ["x", "y"])
    assert isinstance(cls, ClassificationEncoder) and cls.label2id == {"x": 0, "y": 1}
    with pytest.raises(InputError):
        make_encoder(_campaign("classification"), tok, [])


# ---- metrics, hand-checked ------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}},
    "required": ["name"],
}


def test_h2_extraction_rates_by_hand():
    gold = [{"name": "kettle", "qty": 2}] * 4
    outputs = [
        '{"name": "kettle", "qty": 2}',  # valid, schema ok, all fields, exact
        '{"name": "kettle", "qty": 2',  # invalid JSON
        '{"qty": 2}',  # valid JSON, misses required "name" -> schema fails too
        '{"name": "blue kettle", "qty": "2"}',  # valid JSON, qty has the wrong type
    ]
    out = extraction_metrics(gold, outputs, ["name", "qty"], SCHEMA, ids=["a", "b", "c", "d"])
    m = out["metrics"]
    assert m["json_validity"] == 0.75
    assert m["schema_validity"] == 0.25
    assert m["required_field_presence"] == 0.5  # a and d
    assert m["object_exact"] == 0.25
    assert m["per_field"]["name"]["exact"] == 0.25
    # name token F1: a 1.0, b 0, c 0 (absent), d: gold [kettle] vs [blue, kettle] -> 2/3
    assert m["per_field"]["name"]["token_f1"] == pytest.approx((1 + 2 / 3) / 4)
    # qty: exact in a and c; d is "2" (string) vs 2 -> not exact, token F1 1.0
    assert m["per_field"]["qty"]["exact"] == 0.5
    assert m["per_field"]["qty"]["token_f1"] == pytest.approx(3 / 4)
    assert m["field_exact_micro"] == pytest.approx(3 / 8)
    rows = {r["id"]: r for r in out["rows"]}
    assert rows["a"]["valid_json"] and rows["a"]["schema_ok"] and rows["a"]["exact"]
    assert not rows["b"]["valid_json"] and not rows["b"]["fields_present"]
    assert rows["c"]["schema_errors"] == ["$: 'name' is a required property"]
    assert rows["d"]["schema_errors"] == ["$.qty: '2' is not of type 'integer'"]
    assert rows["d"]["fields"]["qty"] == {"match": False, "token_f1": 1.0}


def test_h2_no_schema_means_schema_validity_equals_json_validity():
    m = extraction_metrics([{"a": 1}, {"a": 1}], ['{"a": 1}', "[1]"], [], None)["metrics"]
    assert m["json_validity"] == 0.5 and m["schema_validity"] == 0.5  # a list is not an object
    assert m["schema_checked"] is False


def test_h2_spurious_fields_are_counted():
    gold = [{"city": ["Paris"]}, {"city": ["Rome"]}]
    outputs = ['{"city": ["Paris"], "state": ["TX"]}', '{"city": ["Rome"]}']
    m = extraction_metrics(gold, outputs, [], None)["metrics"]
    assert m["per_field"]["city"]["exact"] == 1.0
    assert "state" not in m["per_field"]  # not a gold field: only seen as a spurious key
    assert m["object_exact"] == 0.5


def test_schema_checker_types():
    assert schema_errors(True, {"type": "integer"}) == ["$: True is not of type 'integer'"]
    assert schema_errors(3.0, {"type": "integer"}) == []
    assert schema_errors(None, {"type": ["string", "null"]}) == []
    assert schema_errors([1, "x"], {"type": "array", "items": {"type": "number"}}) == [
        "$[1]: 'x' is not of type 'number'"
    ]
    nested = {"type": "object", "properties": {"o": {"type": "object", "required": ["k"]}}}
    assert schema_errors({"o": {}}, nested) == ["$.o: 'k' is a required property"]
    closed = {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    assert schema_errors({"a": 1, "b": 2}, closed) == [
        "$: Additional properties are not allowed ('b' was unexpected)"
    ]


def test_h2_format_metrics_by_hand():
    out = format_metrics(["Dear Ann, thanks", "Hello"], ["Dear Ann, thanks\n", "Bye"])
    assert out["metrics"]["exact_match"] == 0.5
    assert out["metrics"]["token_f1"] == 0.5


def test_d5_a_chat_template_that_refuses_the_prompt_is_bad_input_naming_the_row(tok):
    """A template-based prompt wrapped by the tokenizer's chat template: a template that
    refuses a lone user turn names the row and the fix (it was a jinja traceback)."""
    tok.chat_template = "{{ raise_exception('a system turn must come first') }}"
    with pytest.raises(InputError) as info:
        GenerationEncoder(tok, TEMPLATE, max_length=256).encode(ex())
    problem = info.value.problems[0]
    assert problem.where == "train.jsonl:1" and "a system turn must come first" in problem.found
