"""The bundle's model card: the YAML metadata block the Hugging Face Hub reads, and the page.

The card is built with `huggingface_hub`'s own `ModelCardData` and `EvalResult`, so what the
Hub parses (base_model and its revision, license, language, datasets, library_name,
pipeline_tag, tags, the model-index with the validation and sealed-test results) is what
tunepilot wrote; `huggingface_hub.ModelCard` reads it back offline. The page follows the Hub's
card template where the campaign knows the answer (model details, how to use it, training
data, training procedure and hyperparameters, evaluation, limits, framework versions) and is
published as is: it names no path of the machine that wrote it.

A number without its spread misleads on a small validation split, so each reported metric
carries its 95% bootstrap interval over the examples (the same resampling `compare` uses), in
the metric's display name and in the Results list.

User text (class names, the behaviour, file and dataset names, audit sentences) reaches a
page rendered as Markdown with HTML: every such string goes through `escape` (or `code`, a
code span), and code blocks through `fenced` (markdown.py), so none of it can become a tag, an
image or a link.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunepilot.campaign import CLASSIFICATION_TASKS, Campaign
from tunepilot.deliver.markdown import code, escape, fenced

__all__ = ["code", "escape", "fenced", "model_card"]  # the escapers, for every card writer

PIPELINE_TAG = {"classification": "text-classification", "causal_lm": "text-generation",
                "image_classification": "image-classification"}
SMALL_VALIDATION = 200  # below this many examples one example moves accuracy by > 0.5 points


@dataclass
class CardMetric:
    """One reported metric of the chosen run on one split, with its interval."""

    name: str
    value: float
    low: float | None
    high: float | None
    n: int | None  # examples behind it; None when the predictions were not kept

    def shown(self) -> str:
        spread = f" (95% CI {self.low:.3f}-{self.high:.3f})" if self.low is not None else ""
        return f"{self.value:.4f}{spread}" + (f", n={self.n}" if self.n else "")

    def label(self) -> str:
        """The Hub's metric display name: the interval travels with the number."""
        inside = ([f"95% CI {self.low:.3f}-{self.high:.3f}"] if self.low is not None else []) + (
            [f"n={self.n}"] if self.n else [])  # fmt: skip
        return f"{self.name} ({', '.join(inside)})" if inside else self.name


def card_metrics(task: str, predictions: list[Any], metrics: dict[str, Any]) -> list[CardMetric]:
    """The headline metric (and accuracy for classification) with bootstrap intervals."""
    from tunepilot.experiments.compare_stats import interval, make_scorer, stacked

    ids = [p.example_id for p in predictions]
    one_run = [{p.example_id: p for p in predictions}]
    scorers = [make_scorer(task, predictions)] if predictions else []
    if task in CLASSIFICATION_TASKS and predictions:
        scorers.append(make_scorer("accuracy", predictions))  # mean of per-example correct
    out: list[CardMetric] = []
    for scorer in scorers:
        point, low, high = interval(stacked(scorer, one_run, ids)[0], scorer.value)
        name = "accuracy" if scorer.metric == "score" and task in CLASSIFICATION_TASKS else (
            scorer.metric)  # fmt: skip
        out.append(CardMetric(name, point, low, high, len(ids)))
    headline = {m.name for m in out}
    for key, value in metrics.items():  # the run's other numbers, without an interval
        if isinstance(value, int | float) and not isinstance(value, bool) and key not in (
                *headline, "n"):  # fmt: skip
            n = None if key.startswith("train_") else len(ids) or None  # not validation's
            out.append(CardMetric(key, float(value), None, None, n))
    return out


def observed_limits(
    kind: str, metrics: dict[str, Any], n_validation: int, audit: dict[str, Any] | None
) -> list[str]:
    """What this adapter's evidence cannot claim (L5), from its own evaluation and audit;
    every line is already escaped Markdown."""
    limits = []
    if 0 < n_validation < SMALL_VALIDATION:
        rate = "accuracy" if kind != "causal_lm" else "a per-example rate (exact match)"
        limits.append(f"The validation split has {n_validation} examples: an interval above "
                      f"is wide, and one example moves {rate} by "
                      f"{100 / max(n_validation, 1):.1f} points.")  # fmt: skip
    per_class = metrics.get("per_class") or {}
    unseen = sorted(c for c, m in per_class.items() if not (m or {}).get("support"))
    if unseen:
        limits.append(f"No validation example for {', '.join(escape(c) for c in unseen)} (n=0): "
                      "nothing here says how the model does on them.")  # fmt: skip
    scored = sorted((m.get("f1", 0.0), c) for c, m in per_class.items() if (m or {}).get("support"))
    if scored and scored[0][0] < 0.5:
        weak = ", ".join(f"{escape(c)} (F1 {f:.2f})" for f, c in scored[:3] if f < 0.5)
        limits.append(f"Weakest classes on validation: {weak}.")
    for f in (audit or {}).get("findings", []):
        if f.get("verdict") in ("WARN", "FAIL"):
            limits.append(f"Data audit {escape(f['verdict'])} ({escape(f.get('check'))}): "
                          f"{escape(f.get('sentence'))}")  # fmt: skip
    if kind == "causal_lm":
        limits.append("Outputs were checked with greedy decoding only; sampling settings were "
                      "not evaluated.")  # fmt: skip
    return limits or ["None observed in this run's validation and data audit."]


def card_header(
    spec: dict[str, Any],
    source: Any,
    results: list[tuple[str, CardMetric]],
    data: dict[str, Any],
    license_: str | None,
    language: list[str],
) -> str:
    """The `---` YAML block the Hub reads, built by huggingface_hub's own ModelCardData;
    `results` pairs each metric with its split (validation, or test for the sealed look)."""
    from huggingface_hub import EvalResult, ModelCardData

    on_hub = source.kind in ("hub", "bundled")
    revision = source.resolved_commit or source.revision
    task_type = PIPELINE_TAG[spec["model_kind"]]
    name = data.get("name") or "data"
    evals = [
        EvalResult(
            task_type=task_type, dataset_type=name, dataset_name=f"{name} ({split})",
            dataset_split=split, dataset_revision=spec["data_version"],
            metric_type=m.name, metric_value=round(m.value, 6), metric_name=m.label(),
        )  # fmt: skip
        for split, m in results
    ]
    card = ModelCardData(
        base_model=source.name if on_hub else None,
        library_name="peft" if spec["weights"] == "adapter" else "transformers",
        pipeline_tag=task_type,
        license=license_,
        language=language or None,
        datasets=data.get("hub_ids") or None,
        tags=["tunepilot", spec["task"], *(["lora"] if spec["method"] == "lora" else [])],
        model_name=f"{spec['campaign']}-{spec['run_id']}",
        eval_results=evals or None,
        base_model_revision=revision,
        tunepilot_run=spec["run_id"],
        tunepilot_data_version=spec["data_version"],
    )
    return f"---\n{card.to_yaml()}\n---\n\n"


GUARD_NOTE = "README.md and metrics.json of the bundle say so."


def guard_warning(fails: list[str]) -> str:
    """The first lines of a bundle whose run fails its guards (H2): nobody loads it unwarned."""
    if not fails:
        return ""
    items = "".join(f">\n> - {escape(x)}\n" for x in fails)
    return ("> **Warning: this run fails its guards (H2)**, what the campaign said must not "
            f"degrade:\n{items}\n")  # fmt: skip


def read_audit(root: Path, data_version: str) -> dict[str, Any] | None:
    path = root / "data" / data_version / "audit.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def model_card(
    spec: dict[str, Any],
    source: Any,
    bundle_name: str,
    metrics: dict[str, Any],
    controls: dict[str, Any],
    predictions: list[Any] | None,
    audit: dict[str, Any] | None,
    campaign: Campaign,
    env: dict[str, Any],
    facts: Any = None,
) -> str:
    """The page a colleague opens first and the Hub shows (README.md of the bundle).

    `facts` (card_facts.CardFacts) holds what only the campaign folder knows: the data, the
    training procedure, the sealed test, the comparison, license and language. The pilot's
    export, which has no campaign run behind it, passes none and gets the shorter card.
    """
    from tunepilot.deliver import card_sections as s
    from tunepilot.deliver.card_facts import CardFacts

    facts = facts or CardFacts()
    final = metrics.get("final_validation") or metrics
    cards = card_metrics(spec["task"], predictions or [], final)
    test = facts.test
    test_cards = (card_metrics(spec["task"], test["predictions"], test["metrics"])
                  if test else [])  # fmt: skip
    limits = observed_limits(spec["model_kind"], final, len(predictions or []), audit)
    results = [("validation", m) for m in cards] + [("test", m) for m in test_cards]
    header = card_header(spec, source, results, facts.data, facts.license[0], facts.language[0])
    warning = guard_warning(metrics.get("fails_guards") or [])
    body = [
        f"# {escape(spec['campaign'])}: run {escape(spec['run_id'])}\n\n{warning}"
        f"{escape(spec['behaviour'], line_start=True)}",
        s.details(spec, source, campaign, facts),
        s.usage(spec, source, campaign, bundle_name),
        s.check(bundle_name, len(controls["inputs"])),
        s.training_data(facts.data, spec, campaign),
        s.procedure(facts.training, facts.curve),
        s.evaluation(spec, cards, test, test_cards, facts.test_looks),
        s.comparison(facts.comparison),
        "## Observed limits\n\n" + "\n".join(f"- {x}" for x in limits),
        s.frameworks(facts.run_env or env, env),
        s.files(),
    ]
    return header + "\n\n".join(part.strip("\n") for part in body if part) + "\n"
