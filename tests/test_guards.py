"""Guards (H2): per class, never only the mean; extraction format rates vs their minimums.

Metrics dicts are hand-built in the shape evaluate() produces, or computed by the real
extraction_metrics on hand-checked outputs.
"""

from __future__ import annotations

from typing import Any

import pytest

from tunepilot.campaign import validate_mapping
from tunepilot.experiments.guards import check_guards
from tunepilot.tasks.metrics import extraction_metrics
from tunepilot.verdict import Verdict


def campaign(task: str = "classification", **hypothesis: Any):
    fields = {"label": "label"} if task == "classification" else {"target": "target"}
    return validate_mapping(
        {
            "name": "guards",
            "hypothesis": {"behaviour": "route tickets", "task": task, **hypothesis},
            "model": {"name_or_path": "base"},
            "data": {"file": "data.jsonl", "fields": fields},
        }
    )


def cls_metrics(per_class: dict[str, float], support: int = 10, key: str = "f1") -> dict:
    """An evaluate()-shaped classification metrics dict with the given per-class values."""
    block = {
        name: {"precision": v, "recall": v, "f1": v, "support": support, key: v}
        for name, v in per_class.items()
    }
    return {"macro_f1": sum(per_class.values()) / len(per_class), "per_class": block}


def by_check(findings):
    return {f.check: f for f in findings}


def test_h2_variant_improving_macro_f1_but_dropping_one_class_fails_that_guard_by_name():
    baseline = cls_metrics({"refund": 0.55, "delivery": 0.60, "cancel": 0.50})
    variant = cls_metrics({"refund": 0.41, "delivery": 0.95, "cancel": 0.90})
    assert variant["macro_f1"] > baseline["macro_f1"] + 0.1  # the mean improved a lot
    found = by_check(check_guards(campaign(), variant, baseline, None))
    guard = found["guard: class drop vs baseline"]
    assert guard.verdict is Verdict.FAIL
    assert guard.examples == ["refund"]  # only the class that dropped, by name
    assert "class `refund` F1 0.41 < baseline 0.55 - 0.05" in guard.sentence
    assert "delivery" not in guard.sentence and "cancel" not in guard.sentence
    assert "guard: class drop vs control" not in found  # no control given: not judged


def test_h2_drop_at_the_tolerance_passes_and_the_control_is_a_second_reference():
    baseline = cls_metrics({"refund": 0.55, "delivery": 0.60})
    control = cls_metrics({"refund": 0.70, "delivery": 0.80})
    variant = cls_metrics({"refund": 0.50, "delivery": 0.90})  # -0.05 vs baseline: allowed
    found = by_check(check_guards(campaign(), variant, baseline, control))
    assert found["guard: class drop vs baseline"].verdict is Verdict.PASS
    vs_control = found["guard: class drop vs control"]
    assert vs_control.verdict is Verdict.FAIL
    assert vs_control.examples == ["refund"]
    assert "class `refund` F1 0.50 < control 0.70 - 0.05" in vs_control.sentence


def test_h2_every_failing_class_is_named_and_the_tolerance_is_the_campaigns():
    c = campaign(classification_guards={"max_class_drop": 0.2})
    baseline = cls_metrics({"a": 0.9, "b": 0.9, "c": 0.9})
    variant = cls_metrics({"a": 0.6, "b": 0.75, "c": 0.5})
    guard = by_check(check_guards(c, variant, baseline, None))["guard: class drop vs baseline"]
    assert guard.verdict is Verdict.FAIL
    assert guard.examples == ["a", "c"]  # b dropped 0.15 <= 0.2
    assert "- 0.20" in guard.sentence


def test_h2_per_class_floor_and_class_floors_name_each_failing_class():
    c = campaign(classification_guards={"per_class_floor": 0.5, "class_floors": {"vip": 0.8}})
    metrics = cls_metrics({"refund": 0.45, "vip": 0.7, "cancel": 0.6})
    metrics["per_class"]["absent"] = {"precision": 0, "recall": 0, "f1": 0.0, "support": 0}
    floor = by_check(check_guards(c, metrics, metrics, None))["guard: class F1 floor"]
    assert floor.verdict is Verdict.FAIL
    assert floor.examples == ["refund", "vip"]  # a class with no examples is not judged
    assert "class `refund` F1 0.45 < floor 0.50" in floor.sentence
    assert "class `vip` F1 0.70 < floor 0.80" in floor.sentence


def test_h2_class_floor_naming_an_unknown_class_warns_with_the_key_to_fix():
    c = campaign(classification_guards={"class_floors": {"refnud": 0.5}})
    floor = by_check(check_guards(c, cls_metrics({"refund": 0.9}), None, None))
    assert floor["guard: class F1 floor"].verdict is Verdict.WARN
    assert "refnud" in floor["guard: class F1 floor"].sentence
    assert floor["guard: class drop vs baseline"].verdict is Verdict.WARN  # no baseline


def test_h2_guards_judge_the_configured_per_class_metric():
    c = campaign(classification_guards={"metric": "recall"})
    baseline = cls_metrics({"refund": 0.9})
    variant = cls_metrics({"refund": 0.9})
    variant["per_class"]["refund"]["recall"] = 0.3  # F1 unchanged, recall collapsed
    guard = by_check(check_guards(c, variant, baseline, None))["guard: class drop vs baseline"]
    assert guard.verdict is Verdict.FAIL
    assert "class `refund` recall 0.30 < baseline 0.90 - 0.05" in guard.sentence


def test_h2_classification_metrics_without_per_class_numbers_are_refused():
    with pytest.raises(ValueError, match="per_class"):
        check_guards(campaign(), {"macro_f1": 0.9}, None, None)


SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["order_id", "amount"],
}


def test_h2_extraction_guards_count_invalid_json_and_missing_required_fields():
    gold = [{"order_id": "1", "amount": 2.5}] * 5
    outputs = [
        '{"order_id": "1", "amount": 2.5}',  # valid, schema ok, fields present
        '{"order_id": 1, "amount": 2.5}',  # valid JSON, schema broken (int id), fields present
        '{"order_id": "1"}',  # valid JSON, schema broken (missing amount), field missing
        '{order_id: "1", "amount": 2.5}',  # not JSON
        "The order is 1 and the amount 2.5",  # prose, not JSON
    ]
    metrics = extraction_metrics(gold, outputs, ["order_id", "amount"], SCHEMA)["metrics"]
    assert metrics["json_validity"] == pytest.approx(3 / 5)  # hand-checked
    assert metrics["schema_validity"] == pytest.approx(1 / 5)
    assert metrics["required_field_presence"] == pytest.approx(2 / 5)
    c = campaign(
        "extraction",
        required_fields=["order_id", "amount"],
        extraction_guards={
            "json_validity_min": 0.6,
            "schema_validity_min": 0.5,
            "required_field_presence_min": 0.9,
        },
    )
    found = by_check(check_guards(c, metrics, None, None))
    assert found["guard: json validity"].verdict is Verdict.PASS  # 0.6 >= 0.6
    assert "(3/5)" in found["guard: json validity"].sentence
    schema = found["guard: schema validity"]
    assert schema.verdict is Verdict.FAIL and "20.0% (1/5)" in schema.sentence
    required = found["guard: required field presence"]
    assert required.verdict is Verdict.FAIL
    assert "40.0% (2/5)" in required.sentence and "required_field_presence_min" in required.sentence


def test_h2_format_task_without_rates_warns_instead_of_passing_silently():
    c = validate_mapping(
        {
            "name": "fmt",
            "hypothesis": {"behaviour": "answer in format", "task": "format"},
            "model": {"name_or_path": "base"},
            "data": {"file": "d.jsonl", "fields": {"target": "target"}},
        }
    )
    findings = check_guards(c, {"exact_match": 0.5, "token_f1": 0.7}, None, None)
    assert [f.verdict for f in findings] == [Verdict.WARN]
