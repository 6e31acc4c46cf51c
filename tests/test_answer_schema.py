"""Extraction answers judged by the campaign's JSON Schema (H2): null is an answer, not an
absence, and every keyword of the declared draft counts (minimum, pattern, oneOf, $ref)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tunepilot.campaign import validate_mapping
from tunepilot.campaign.answer_schema import schema_errors, schema_problem
from tunepilot.campaign.templates import template_text
from tunepilot.errors import InputError
from tunepilot.experiments.guards import check_guards
from tunepilot.tasks.metrics import extraction_metrics
from tunepilot.verdict import Verdict


def shipped_extraction() -> dict:
    return yaml.safe_load(template_text("extraction").replace("{DIR}", "."))


# The shipped template's data shape: four fields, any of them may be null.
GOLD = [
    {"order_id": "A-1001", "product": "kettle", "amount": 19.99, "date": "2024-03-01"},
    {"order_id": None, "product": "toaster", "amount": None, "date": None},
    {"order_id": "A-1003", "product": None, "amount": 5, "date": "2024-03-04"},
    {"order_id": None, "product": None, "amount": None, "date": None},
]


def test_h2_extraction_output_equal_to_gold_passes_every_guard():
    campaign = validate_mapping(shipped_extraction())
    hyp = campaign.hypothesis
    outputs = [json.dumps(g) for g in GOLD]
    scored = extraction_metrics(GOLD, outputs, hyp.required_fields, hyp.target_schema)
    m = scored["metrics"]
    assert m["json_validity"] == m["schema_validity"] == m["required_field_presence"] == 1.0
    assert m["object_exact"] == 1.0 and m["field_exact_micro"] == 1.0
    assert all(r["fields_present"] and r["schema_ok"] for r in scored["rows"])
    findings = check_guards(campaign, m, None, None)
    assert findings and all(f.verdict is Verdict.PASS for f in findings), findings


def test_h2_null_where_the_schema_forbids_it_is_present_but_schema_invalid():
    schema = {
        "type": "object",
        "properties": {"product": {"type": "string"}, "amount": {"type": ["number", "null"]}},
        "required": ["product", "amount"],
    }
    gold = [{"product": "kettle", "amount": None}] * 2
    outputs = ['{"product": null, "amount": null}', '{"amount": null}']
    scored = extraction_metrics(gold, outputs, ["product", "amount"], schema, ids=["a", "b"])
    rows = {r["id"]: r for r in scored["rows"]}
    assert rows["a"]["fields_present"] and not rows["a"]["schema_ok"]
    assert rows["a"]["schema_errors"] == ["$.product: None is not of type 'string'"]
    assert not rows["b"]["fields_present"]  # the key itself is missing
    assert scored["metrics"]["required_field_presence"] == 0.5


@pytest.mark.parametrize(
    ("schema", "bad", "good"),
    [
        ({"type": "number", "minimum": 0}, -1, 3),
        ({"type": "string", "pattern": "^A-[0-9]+$"}, "B-12", "A-12"),
        ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, 1.5, 7),
        (
            {"$defs": {"id": {"type": "string", "maxLength": 3}}, "$ref": "#/$defs/id"},
            "toolong",
            "abc",
        ),
        ({"type": "string", "format": "date"}, "2024-13-45", "2024-03-01"),
    ],
    ids=["minimum", "pattern", "oneOf", "$ref", "format"],
)
def test_h2_schema_validity_honours_every_keyword_of_the_draft(schema, bad, good):
    assert schema_errors(good, schema) == []
    assert len(schema_errors(bad, schema)) == 1


def test_h2_the_declared_draft_decides_what_the_schema_means():
    draft4 = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,  # a boolean in draft 4, a number from draft 6 on
    }
    assert schema_problem(draft4) is None
    assert schema_errors(0, draft4) and not schema_errors(0.5, draft4)
    undeclared = {k: v for k, v in draft4.items() if k != "$schema"}  # read as 2020-12
    assert "exclusiveMinimum" in (schema_problem(undeclared) or "")


def _extraction_with(schema: dict) -> dict:
    raw = shipped_extraction()
    raw["hypothesis"]["target_schema"] = schema
    return raw


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "objekt"}, "at `type`"),
        ({"type": "object", "properties": {"amount": {"minimum": "0"}}},
         "at `properties.amount.minimum`"),  # fmt: skip
        ({"$schema": "http://example.com/my-draft"}, "unknown `$schema`"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
         "points to nothing inside the schema"),  # fmt: skip
        ({"$ref": "https://example.com/remote.json"}, "points to nothing inside the schema"),
    ],
    ids=["type", "nested-keyword", "unknown-draft", "dangling-ref", "remote-ref"],
)
def test_h2_an_invalid_target_schema_is_refused_at_load_naming_the_key(schema, words):
    with pytest.raises(InputError) as caught:
        validate_mapping(_extraction_with(schema))
    text = str(caught.value)
    assert "hypothesis.target_schema" in text and words in text, text


def test_h2_validate_names_the_schema_key_and_exits_2(tmp_path: Path):
    raw = _extraction_with({"type": "object", "properties": {"amount": {"type": "numbr"}}})
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "tunepilot.cli", "validate", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "hypothesis.target_schema" in done.stderr + done.stdout
    assert "properties.amount.type" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
