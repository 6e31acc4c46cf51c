"""The format task's guards are judged (H2): the shipped `format` template's JSON validity and
required fields are computed from the model's outputs and FAIL when the outputs are not the
format; and `validate` says when a declared guard cannot be computed for the task."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from tunepilot.campaign import validate_mapping
from tunepilot.campaign.checks import guard_warnings
from tunepilot.campaign.templates import template_text
from tunepilot.experiments.guards import check_guards
from tunepilot.tasks.example import Example
from tunepilot.tasks.metrics import format_metrics
from tunepilot.verdict import Verdict

# customer messages with the house answer (SMS-style texts, the shipped template's fields)
ROWS = [
    ("where is my parcel, it is 3 days late", {"reply": "We are checking it now.", "tone": "calm"}),
    ("u charged me twice!!!", {"reply": "Sorry, the second charge is refunded.", "tone": "warm"}),
    ("cancel my order pls", {"reply": "Your order is cancelled.", "tone": "neutral"}),
    ("can I pay by card?", {"reply": "Yes, every major card.", "tone": "neutral"}),
]  # fmt: skip


def shipped_format(model: str = "base-model") -> dict:
    raw = yaml.safe_load(template_text("format"))
    raw["model"]["name_or_path"] = model
    return raw


def by_check(findings) -> dict:
    return {f.check: f for f in findings}


def test_h2_format_outputs_that_are_not_json_fail_the_json_validity_guard_from_a_real_model(
    tiny_llama_dir: Path,
) -> None:
    """The untrained tiny Llama writes noise: 0 of 4 outputs parse, and the shipped guard
    (json_validity_min 0.98) FAILs instead of one WARN that never blocks."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tunepilot.experiments.evaluate import evaluate
    from tunepilot.tasks import make_encoder

    campaign = validate_mapping(shipped_format())
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    encoder = make_encoder(campaign, tokenizer, [])
    examples = [Example(f"m{i}", text, f"replies.jsonl:{i + 1}", target=answer)
                for i, (text, answer) in enumerate(ROWS)]  # fmt: skip
    result = evaluate(model, encoder, examples, batch_size=4, max_new_tokens=12)
    m = result.metrics
    parsed = [isinstance(_loads(r["output"]), dict) for r in result.rows]  # recounted here
    assert m["json_validity"] == sum(parsed) / 4 == 0.0
    assert "json_validity" in result.config["metric_names"]
    guards = by_check(check_guards(campaign, m, None, None))
    assert guards["guard: json validity"].verdict is Verdict.FAIL
    assert "0.0% (0/4)" in guards["guard: json validity"].sentence
    assert guards["guard: required field presence"].verdict is Verdict.FAIL


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def test_h2_format_outputs_in_the_house_format_pass_every_format_guard() -> None:
    campaign = validate_mapping(shipped_format())
    gold = [json.dumps(a, separators=(",", ":")) for _, a in ROWS]
    scored = format_metrics(gold, gold, json_answers=True,
                            required_fields=campaign.hypothesis.required_fields)  # fmt: skip
    guards = check_guards(campaign, scored["metrics"], None, None)
    assert [g.verdict for g in guards] == [Verdict.PASS] * 3, [g.sentence for g in guards]
    missing = format_metrics(gold, ['{"reply": "ok"}'] * 4, json_answers=True,
                             required_fields=["reply", "tone"])  # fmt: skip
    assert missing["metrics"]["json_validity"] == 1.0
    assert missing["metrics"]["required_field_presence"] == 0.0


def test_h2_validate_names_a_declared_guard_the_task_cannot_compute(tmp_path: Path) -> None:
    classifier = {
        "name": "c", "model": {"name_or_path": "m"},
        "hypothesis": {"behaviour": "b", "task": "classification",
                       "extraction_guards": {"json_validity_min": 0.9}},
        "data": {"file": "d.jsonl", "fields": {"label": "label"}},
    }  # fmt: skip
    chat = {
        "name": "c", "model": {"name_or_path": "m"},
        "hypothesis": {"behaviour": "b", "task": "format",
                       "extraction_guards": {"json_validity_min": 0.9}},
        "data": {"file": "d.jsonl", "chat": {}},
    }  # fmt: skip
    no_schema = json.loads(json.dumps(chat))
    no_schema["data"] = {"file": "d.jsonl", "fields": {"target": "answer"}}
    no_schema["hypothesis"]["extraction_guards"] = {"schema_validity_min": 0.9}
    for raw, key in ((classifier, "hypothesis.extraction_guards"),
                     (chat, "hypothesis.extraction_guards"),
                     (no_schema, "hypothesis.extraction_guards.schema_validity_min")):
        warned = guard_warnings(validate_mapping(raw))
        assert [w.where for w in warned] == [key], warned
    assert guard_warnings(validate_mapping(shipped_format())) == []  # the clean control
    # the command line says it, and still exits 0 (a warning)
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump(classifier))
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": f"t{i}", "label": "ab"[i % 2]})
                                              + "\n" for i in range(60)))  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "tunepilot.cli", "validate",
                           str(tmp_path / "campaign.yaml")], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "hypothesis.extraction_guards" in done.stderr and "never judged" in done.stderr


def test_h2_the_shipped_format_template_declares_guards_its_evaluation_computes(
    tiny_llama_dir: Path,
) -> None:
    from transformers import AutoTokenizer

    from tunepilot.experiments.evaluate import eval_config
    from tunepilot.tasks import make_encoder

    campaign = validate_mapping(shipped_format())
    encoder = make_encoder(campaign, AutoTokenizer.from_pretrained(tiny_llama_dir), [])
    names = eval_config(encoder, [], 4, 8)["metric_names"]
    declared = campaign.hypothesis.extraction_guards.model_fields_set
    assert declared and {k.removesuffix("_min") for k in declared} <= set(names)
