"""Metrics for every task kind, in plain Python (no torch, no numpy, no sklearn).

Guards are judged per class and per field (H2), so these functions return the per-class and
per-field numbers next to the global ones, plus one row per example so a gain limited to a few
examples can be seen (H3). Answers are checked against the campaign's JSON Schema by the
`jsonschema` library (campaign/answer_schema.py), every keyword of the declared draft included.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from tunepilot.campaign.answer_schema import schema_errors

# --------------------------------------------------------------------------------------------
# classification
# --------------------------------------------------------------------------------------------


def _safe_div(num: float, den: float) -> float:
    """0.0 when nothing was predicted/present: the sklearn `zero_division=0` convention."""
    return num / den if den else 0.0


def _f1(precision: float, recall: float) -> float:
    return _safe_div(2 * precision * recall, precision + recall)


def classification_metrics(gold: list[str], pred: list[str], labels: list[str]) -> dict[str, Any]:
    """Accuracy, macro and micro averages, and precision/recall/F1/support per class (H2).

    `per_class` lists every name in `labels` (a class absent from this split shows support 0),
    in label-id order. Macro averages run over the classes that occur in `gold` or `pred`, so a
    class absent from the evaluation split does not drag the mean to 0. With one label per
    example micro precision = recall = F1 = accuracy; a prediction outside `labels` simply
    counts as wrong.
    """
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold labels but {len(pred)} predictions")
    tp: Counter[str] = Counter()
    n_pred: Counter[str] = Counter(pred)
    n_gold: Counter[str] = Counter(gold)
    for g, p in zip(gold, pred, strict=True):
        if g == p:
            tp[g] += 1
    names = list(labels) + sorted((set(gold) | set(pred)) - set(labels))
    per_class: dict[str, dict[str, float | int]] = {}
    for name in names:
        precision = _safe_div(tp[name], n_pred[name])
        recall = _safe_div(tp[name], n_gold[name])
        per_class[name] = {
            "precision": precision,
            "recall": recall,
            "f1": _f1(precision, recall),
            "support": n_gold[name],
        }
    seen = [name for name in names if n_gold[name] or n_pred[name]]
    correct = sum(tp.values())
    accuracy = _safe_div(correct, len(gold))
    micro_p = _safe_div(correct, len(pred))
    micro_r = _safe_div(correct, len(gold))
    return {
        "n": len(gold),
        "accuracy": accuracy,
        "macro_precision": _safe_div(sum(per_class[c]["precision"] for c in seen), len(seen)),
        "macro_recall": _safe_div(sum(per_class[c]["recall"] for c in seen), len(seen)),
        "macro_f1": _safe_div(sum(per_class[c]["f1"] for c in seen), len(seen)),
        "micro_precision": micro_p,
        "micro_recall": micro_r,
        "micro_f1": _f1(micro_p, micro_r),
        "per_class": per_class,
    }


# --------------------------------------------------------------------------------------------
# extraction and format
# --------------------------------------------------------------------------------------------


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The output as a JSON object, or None. Surrounding whitespace is allowed, prose is not:
    an answer that needs fishing out of a sentence is not a valid format."""
    try:
        value = json.loads(text.strip())
    except (json.JSONDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _value_tokens(value: Any) -> list[str]:
    """Words of a field value for token F1: strings and list items, lowercased."""
    if value is None:
        return []
    if isinstance(value, list):
        return [tok for item in value for tok in _value_tokens(item)]
    text = value if isinstance(value, str) else _canonical(value)
    return re.findall(r"\w+|[^\w\s]", text.lower())


def token_f1(gold: Any, pred: Any) -> float:
    """SQuAD-style bag-of-words F1 between two field values; both empty counts as 1.0."""
    g, p = _value_tokens(gold), _value_tokens(pred)
    if not g and not p:
        return 1.0
    common = sum((Counter(g) & Counter(p)).values())
    precision, recall = _safe_div(common, len(p)), _safe_div(common, len(g))
    return _f1(precision, recall)


def answer_checks(
    text: str, required_fields: list[str], schema: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, list[str], bool, bool]:
    """One output against the answer contract: (the object it parses to or None, schema
    errors, matches the schema, carries every required field). The one judgement behind the
    extraction and format rates, so the two tasks can never count them differently."""
    obj = parse_json_object(text)
    errors = schema_errors(obj, schema) if (obj is not None and schema) else []
    present = obj is not None and all(_present(obj, f) for f in required_fields)
    return obj, errors, obj is not None and not errors, present


def _present(obj: dict[str, Any] | None, name: str) -> bool:
    """A required field is present when its key is there. `null` is an answer ("the message
    names no order id"), not an absence: whether null is allowed is the schema's to say, and
    schema validity judges it."""
    return obj is not None and name in obj


def extraction_metrics(
    gold_targets: list[dict[str, Any]],
    outputs: list[str],
    required_fields: list[str],
    schema: dict[str, Any] | None,
    ids: list[str] | None = None,
) -> dict[str, Any]:
    """Format validity, required-field presence and per-field accuracy of JSON answers (H2).

    Rates are over all examples (an output that is not a JSON object fails every check):
    `json_validity` (parses to an object), `schema_validity` (object that matches `schema`;
    equal to json_validity when no schema is given), `required_field_presence` (every required
    key present; a null value counts, the schema decides whether null is allowed),
    `object_exact` (the whole object equals the gold one). Per field (every key of any gold
    object, plus required ones) over the examples whose gold has it: `exact` and `token_f1`,
    and `spurious` = outputs that invent the field when gold lacks it.
    `field_exact_macro`/`field_token_f1_macro` average fields; `*_micro` average (example,
    field) pairs. Returns {"metrics": {...}, "rows": [...]}, one row per example.
    """
    if len(gold_targets) != len(outputs):
        raise ValueError(f"{len(gold_targets)} gold targets but {len(outputs)} outputs")
    ids = ids if ids is not None else [str(i) for i in range(len(outputs))]
    fields = list(dict.fromkeys([*required_fields, *(k for g in gold_targets for k in g)]))
    stats = {f: {"support": 0, "exact": 0, "token_f1": 0.0, "spurious": 0} for f in fields}
    rows: list[dict[str, Any]] = []
    n_json = n_schema = n_required = n_exact = 0
    for example_id, gold, text in zip(ids, gold_targets, outputs, strict=True):
        obj, errors, schema_ok, fields_present = answer_checks(text, required_fields, schema)
        per_field: dict[str, dict[str, Any]] = {}
        for name in fields:
            if name in gold:
                pred_value = obj.get(name) if obj is not None else None
                match = (
                    obj is not None
                    and name in obj
                    and _canonical(pred_value) == _canonical(gold[name])
                )
                f1 = token_f1(gold[name], pred_value) if obj is not None and name in obj else 0.0
                stats[name]["support"] += 1
                stats[name]["exact"] += int(match)
                stats[name]["token_f1"] += f1
                per_field[name] = {"match": match, "token_f1": f1}
            elif obj is not None and name in obj:
                stats[name]["spurious"] += 1
        exact = obj is not None and _canonical(obj) == _canonical(gold)
        n_json += obj is not None
        n_schema += schema_ok
        n_required += fields_present
        n_exact += exact
        rows.append(
            {
                "id": example_id,
                "valid_json": obj is not None,
                "schema_ok": schema_ok,
                "schema_errors": errors,
                "fields_present": fields_present,
                "exact": exact,
                "fields": per_field,
            }
        )
    n = len(outputs)
    per_field_metrics = {
        name: {
            "support": s["support"],
            "exact": _safe_div(s["exact"], s["support"]),
            "token_f1": _safe_div(s["token_f1"], s["support"]),
            "spurious": s["spurious"],
        }
        for name, s in stats.items()
    }
    supported = [f for f in fields if stats[f]["support"]]
    pairs = sum(stats[f]["support"] for f in fields)
    metrics = {
        "n": n,
        "json_validity": _safe_div(n_json, n),
        "schema_validity": _safe_div(n_schema, n),
        "required_field_presence": _safe_div(n_required, n),
        "object_exact": _safe_div(n_exact, n),
        "field_exact_macro": _safe_div(
            sum(per_field_metrics[f]["exact"] for f in supported), len(supported)
        ),
        "field_token_f1_macro": _safe_div(
            sum(per_field_metrics[f]["token_f1"] for f in supported), len(supported)
        ),
        "field_exact_micro": _safe_div(sum(stats[f]["exact"] for f in fields), pairs),
        "field_token_f1_micro": _safe_div(sum(stats[f]["token_f1"] for f in fields), pairs),
        "schema_checked": schema is not None,
        "per_field": per_field_metrics,
    }
    return {"metrics": metrics, "rows": rows}


def format_metrics(
    gold: list[str],
    outputs: list[str],
    ids: list[str] | None = None,
    *,
    json_answers: bool = False,
    required_fields: list[str] | None = None,
    schema: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A response-format task: exact match and token F1 of the whole answer text, per example.

    Whitespace at both ends is ignored (generation stops at EOS, a trailing newline is not the
    format). With `json_answers` (the answers are JSON objects: a format campaign's targets, or
    a conversation whose hypothesis declares required fields or a schema) the format guards'
    rates come too, judged as extraction judges them (`answer_checks`): `json_validity`,
    `schema_validity` (= json_validity without a schema) and `required_field_presence`.
    Returns {"metrics": {...}, "rows": [...]}.
    """
    if len(gold) != len(outputs):
        raise ValueError(f"{len(gold)} gold answers but {len(outputs)} outputs")
    ids = ids if ids is not None else [str(i) for i in range(len(outputs))]
    required = list(required_fields or [])
    rows = []
    for example_id, g, o in zip(ids, gold, outputs, strict=True):
        row: dict[str, Any] = {"id": example_id, "exact": g.strip() == o.strip(),
                               "token_f1": token_f1(g, o)}  # fmt: skip
        if json_answers:
            obj, errors, schema_ok, present = answer_checks(o, required, schema)
            row.update(valid_json=obj is not None, schema_ok=schema_ok, schema_errors=errors,
                       fields_present=present)  # fmt: skip
        rows.append(row)
    n = len(rows)
    metrics: dict[str, Any] = {
        "n": n,
        "exact_match": _safe_div(sum(r["exact"] for r in rows), n),
        "token_f1": _safe_div(sum(r["token_f1"] for r in rows), n),
    }
    if json_answers:
        metrics.update(
            json_validity=_safe_div(sum(r["valid_json"] for r in rows), n),
            schema_validity=_safe_div(sum(r["schema_ok"] for r in rows), n),
            required_field_presence=_safe_div(sum(r["fields_present"] for r in rows), n),
            schema_checked=schema is not None,
        )
    return {"metrics": metrics, "rows": rows}
