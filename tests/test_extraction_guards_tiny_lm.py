"""Extraction guards (H2) on SNIPS-style data with a tiny causal LM: invalid JSON outputs and
missing required fields are counted correctly.

Every count is checked twice: by hand (each output below is labelled in a comment) and by an
independent recount from the raw `output` strings with `json.loads`, never by re-reading the
metrics' own per-row flags. Three sources of outputs:
- the untrained tiny Llama through the real `evaluate()` (greedy generation emits noise);
- the same Llama after it memorised six designed answers (two good, one cut JSON, one missing
  the required field, one with a wrong type, one prose), again through `evaluate()`, so the
  generation -> decode -> score path is exercised on a known mix;
- five hand-written outputs fed straight to `extraction_metrics`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tunepilot.campaign import validate_mapping
from tunepilot.experiments.evaluate import evaluate
from tunepilot.experiments.guards import check_guards
from tunepilot.tasks.example import Example
from tunepilot.tasks.generation import GenerationEncoder
from tunepilot.tasks.metrics import extraction_metrics
from tunepilot.verdict import Verdict

TEMPLATE = "{text}\nJSON: "
REQUIRED = ["playlist"]
SLOT = {"type": "array", "items": {"type": "string"}}
SCHEMA = {
    "type": "object",
    "properties": {"playlist": SLOT, "music_item": SLOT, "artist": SLOT, "entity_name": SLOT},
    "required": REQUIRED,
}

# SNIPS AddToPlaylist-style utterances with their slots (values are lists, as in SNIPS).
SNIPS = [
    ("Add another song to the Cita Romantica playlist.",
     {"music_item": ["song"], "playlist": ["Cita Romantica"]}),
    ("add clem burke in my playlist Pre-Party R&B Jams",
     {"artist": ["clem burke"], "playlist": ["Pre-Party R&B Jams"]}),
    ("Add Live from Aragon Ballroom to Trapeo",
     {"entity_name": ["Live from Aragon Ballroom"], "playlist": ["Trapeo"]}),
    ("put a track on my list", {"music_item": ["track"], "playlist": ["my list"]}),
    ("add Blue Train to Indie Mix", {"entity_name": ["Blue Train"], "playlist": ["Indie Mix"]}),
    ("play something nice for the Chill playlist", {"playlist": ["Chill"]}),
]  # fmt: skip

# What the memorised model is taught to write for each utterance above, hand-labelled
# (valid JSON object, all required fields present and non-null, matches SCHEMA):
DESIGNED = [
    '{"playlist":["Cita Romantica"],"music_item":["song"]}',  # json yes, fields yes, schema yes
    '{"playlist":["Pre-Party R&B Jams"],"artist":["clem burke"]}',  # yes, yes, yes
    '{"playlist":["Trapeo"',  # cut JSON: no, no, no
    '{"music_item":["track"]}',  # json yes, `playlist` missing: fields no, schema no
    '{"playlist":"Indie Mix"}',  # json yes, fields yes, string not array: schema no
    "add it to the Chill playlist",  # prose: no, no, no
]
HAND_JSON = [True, True, False, True, True, False]  # 4/6
HAND_FIELDS = [True, True, False, False, True, False]  # 3/6
HAND_SCHEMA = [True, True, False, False, False, False]  # 2/6


def snips_examples(targets: list[Any] | None = None) -> list[Example]:
    """The six utterances with their gold slots (or with `targets`, for teaching)."""
    return [
        Example(
            id=f"snips-{i}",
            text=text,
            source=f"snips.jsonl:{i + 1}",
            target=slots if targets is None else targets[i],
        )
        for i, (text, slots) in enumerate(SNIPS)
    ]


def extraction_campaign(**guards: float):
    """An extraction campaign object, as `load_campaign` would build it from YAML."""
    return validate_mapping(
        {
            "name": "snips-slots",
            "hypothesis": {
                "behaviour": "Extract the playlist slots of a request as JSON.",
                "task": "extraction",
                "required_fields": REQUIRED,
                "target_schema": SCHEMA,
                "extraction_guards": guards,
            },
            "model": {"name_or_path": "base-model"},
            "data": {"file": "snips.jsonl", "fields": {"target": "slots"}, "template": TEMPLATE},
        }
    )


def encoder_for(campaign, tokenizer) -> GenerationEncoder:
    h = campaign.hypothesis
    return GenerationEncoder(
        tokenizer,
        campaign.data.template,
        max_length=256,
        required_fields=h.required_fields,
        schema=h.target_schema,
    )


def recount(outputs: list[str]) -> tuple[list[bool], list[bool]]:
    """Per output: parses to a JSON object; and that object has every required key.

    Written independently of tasks/metrics.py: plain json.loads on the raw string.
    """
    valid, fields = [], []
    for text in outputs:
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        ok = isinstance(obj, dict)
        valid.append(ok)
        fields.append(ok and all(f in obj for f in REQUIRED))
    return valid, fields


def by_check(findings):
    return {f.check: f for f in findings}


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


@pytest.fixture(scope="module")
def memorised_model(tiny_llama_dir, tokenizer):
    """The tiny Llama taught (full fine-tuning) to answer each utterance with DESIGNED[i].

    Taught through a `format` encoder, whose answer is the raw string, so the model can be
    made to emit invalid JSON on purpose; the prompt is the one the extraction encoder builds.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from tunepilot.experiments.evaluate import pad_id_of
    from tunepilot.tasks.base import IGNORE_INDEX

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    teacher = GenerationEncoder(tokenizer, TEMPLATE, max_length=256, task="format")
    encoded = [teacher.encode(e) for e in snips_examples(DESIGNED)]
    width = max(len(e.input_ids) for e in encoded)
    pad = pad_id_of(tokenizer)
    ids = torch.tensor([e.input_ids + [pad] * (width - len(e.input_ids)) for e in encoded])
    mask = torch.tensor(
        [[1] * len(e.input_ids) + [0] * (width - len(e.input_ids)) for e in encoded]
    )
    labels = torch.tensor([e.labels + [IGNORE_INDEX] * (width - len(e.labels)) for e in encoded])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(400):  # loss < 0.01 after ~100 full-batch steps (seconds)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:
            break
    model.eval()
    return model


def test_h2_untrained_tiny_llama_outputs_are_counted_invalid_and_the_guard_fails(
    tiny_llama_dir, tokenizer
):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    campaign = extraction_campaign()
    result = evaluate(model, encoder_for(campaign, tokenizer), snips_examples(), 3, 24)
    outputs = [r["output"] for r in result.rows]
    assert len(outputs) == 6
    valid, fields = recount(outputs)
    # hand-check: an untrained model writes byte soup, never a JSON object
    assert sum(valid) == 0 and sum(fields) == 0, outputs
    assert result.metrics["n"] == 6
    assert result.metrics["json_validity"] == sum(valid) / 6
    assert result.metrics["required_field_presence"] == sum(fields) / 6
    assert result.metrics["schema_validity"] == 0.0
    assert [r["gold"] for r in result.rows] == [slots for _, slots in SNIPS]

    found = by_check(check_guards(campaign, result.metrics, None, None))
    json_guard = found["guard: json validity"]
    assert json_guard.verdict is Verdict.FAIL
    assert "0.0% (0/6)" in json_guard.sentence and "95.0%" in json_guard.sentence
    assert "json_validity_min" in json_guard.sentence
    required = found["guard: required field presence"]
    assert required.verdict is Verdict.FAIL and "(0/6)" in required.sentence
    assert found["guard: schema validity"].verdict is Verdict.FAIL


def test_h2_generated_invalid_json_and_missing_fields_are_counted_exactly(
    memorised_model, tokenizer
):
    campaign = extraction_campaign(
        json_validity_min=0.6, required_field_presence_min=0.5, schema_validity_min=0.5
    )
    result = evaluate(memorised_model, encoder_for(campaign, tokenizer), snips_examples(), 6, 64)
    outputs = [r["output"] for r in result.rows]
    assert outputs == DESIGNED  # the model wrote what it was taught, through evaluate()
    assert all(r["stopped_at_eos"] for r in result.rows)

    valid, fields = recount(outputs)
    assert valid == HAND_JSON and fields == HAND_FIELDS  # recount agrees with the hand labels
    m = result.metrics
    assert m["n"] == 6
    assert m["json_validity"] == pytest.approx(sum(valid) / 6) == pytest.approx(4 / 6)
    assert m["required_field_presence"] == pytest.approx(sum(fields) / 6) == pytest.approx(3 / 6)
    assert m["schema_validity"] == pytest.approx(sum(HAND_SCHEMA) / 6)
    assert [r["valid_json"] for r in result.rows] == HAND_JSON
    assert [r["fields_present"] for r in result.rows] == HAND_FIELDS
    assert [r["schema_ok"] for r in result.rows] == HAND_SCHEMA
    assert any("is not of type 'array'" in e for e in result.rows[4]["schema_errors"])

    found = by_check(check_guards(campaign, m, None, None))
    assert found["guard: json validity"].verdict is Verdict.PASS  # 66.7% >= 60%
    assert "66.7% (4/6)" in found["guard: json validity"].sentence
    assert found["guard: required field presence"].verdict is Verdict.PASS  # 50% at the min
    assert "50.0% (3/6)" in found["guard: required field presence"].sentence
    schema = found["guard: schema validity"]
    assert schema.verdict is Verdict.FAIL and "33.3% (2/6)" in schema.sentence
    assert "schema_validity_min" in schema.sentence

    strict = by_check(check_guards(extraction_campaign(), m, None, None))  # 0.95 / 0.9 / 0.9
    assert strict["guard: json validity"].verdict is Verdict.FAIL
    assert "66.7% (4/6)" in strict["guard: json validity"].sentence
    assert strict["guard: required field presence"].verdict is Verdict.FAIL


def test_h2_hand_written_outputs_give_the_exact_rates_and_verdicts():
    gold = [slots for _, slots in SNIPS[:5]]
    outputs = [
        '{"music_item": ["song"], "playlist": ["Cita Romantica"]}',  # A: valid, fields, schema
        ' {"artist": ["clem burke"], "playlist": ["Pre-Party R&B Jams"]}\n',  # B: same (spaces)
        "{'playlist': ['Trapeo']}",  # C: single quotes -> not JSON
        '{"music_item": ["track"]}',  # D: valid JSON, `playlist` missing
        '{"playlist": "Indie Mix"}',  # E: valid JSON, playlist present, but a string
    ]
    # By hand over 5 outputs:
    #   json_validity           = A, B, D, E     = 4/5 = 0.8
    #   required_field_presence = A, B, E        = 3/5 = 0.6 (D lacks it, C is not JSON)
    #   schema_validity         = A, B           = 2/5 = 0.4 (D misses a required field, E's
    #                                                          playlist is not an array)
    valid, fields = recount(outputs)
    assert (sum(valid), sum(fields)) == (4, 3)
    m = extraction_metrics(gold, outputs, REQUIRED, SCHEMA, ids=list("ABCDE"))["metrics"]
    assert m["json_validity"] == pytest.approx(4 / 5)
    assert m["required_field_presence"] == pytest.approx(3 / 5)
    assert m["schema_validity"] == pytest.approx(2 / 5)

    campaign = extraction_campaign(
        json_validity_min=0.8, required_field_presence_min=0.7, schema_validity_min=0.4
    )
    found = by_check(check_guards(campaign, m, None, None))
    verdicts = {check: f.verdict for check, f in found.items()}
    assert verdicts == {
        "guard: json validity": Verdict.PASS,  # 0.8 >= 0.8 (at the minimum)
        "guard: required field presence": Verdict.FAIL,  # 0.6 < 0.7
        "guard: schema validity": Verdict.PASS,  # 0.4 >= 0.4
    }
    assert "80.0% (4/5)" in found["guard: json validity"].sentence
    assert "60.0% (3/5)" in found["guard: required field presence"].sentence
    assert "40.0% (2/5)" in found["guard: schema validity"].sentence
