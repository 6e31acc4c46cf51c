"""The bundle's comparison.json (L5): the campaign's decision, and the exported run against
the control and the baseline, with intervals, seeds and every run's line.

What the bundle says is the decision that stands for the evidence at export time, read from
the ledger (`compare.decided` records it if `compare` was not run since the evidence last
changed): so a bundle names decision #N of the notebook, and a restored copy of the campaign
exports the very same bytes. The run against the baseline is a paired bootstrap over the
validation examples both predicted, with the statistics `compare` uses.
"""

from __future__ import annotations

from typing import Any

from tunepilot.campaign.variants import CONTROL
from tunepilot.experiments.compare import decided
from tunepilot.experiments.compare_stats import BOOTSTRAP_SEED, LEVEL, RESAMPLES

BUNDLE_FORMAT = "tunepilot-comparison/1"


def bundle_comparison(ws: Any, run_id: str) -> dict[str, Any]:
    """comparison.json of a bundle: the decision that stands, and the exported run's variant
    against the control and the baseline, with intervals, seeds and every run's line."""
    from tunepilot.ledger import Ledger

    cmp, decision, _ = decided(ws)  # the decision that stands for today's evidence
    with Ledger.open(ws.ledger_path) as ledger:
        row = ledger.get_run(run_id)
        against_baseline = _against_baseline(ledger, ws.campaign.hypothesis.task, run_id)
    out: dict[str, Any] = {"format": BUNDLE_FORMAT, "run_id": run_id, "variant": row.variant,
                           "seed": row.seed, "level": LEVEL}  # fmt: skip
    if decision is None:
        return out | {"decision": None, "why": cmp.decision}
    body = decision.body
    variants = {v["name"]: v for v in body["variants"]}
    mine = variants.get(row.variant)
    out |= {
        "decision": decision.to_json(),
        "metric": body["metric"],
        "chosen": (decision.adopted or CONTROL) == row.variant,
        "vs_control": None if row.variant == CONTROL or mine is None else {
            "interval": mine.get("ci"), "per_class_or_field": mine["deltas"].get("vs_control"),
            "blocked": mine.get("blocked")},
        "vs_baseline": against_baseline | {
            "per_class_or_field": (mine or {}).get("deltas", {}).get("vs_baseline")},
        "seeds": {name: {"summary": v["summary"],
                         "runs": [{k: x[k] for k in ("run_id", "seed", "status", "excluded")}
                                  for x in v["runs"]]}
                  for name, v in variants.items() if name in (row.variant, CONTROL)},
        "guards": {name: [{k: f[k] for k in ("check", "verdict", "sentence")} for f in v["guards"]]
                   for name, v in variants.items() if name in (row.variant, CONTROL)},
    }  # fmt: skip
    return out


def _against_baseline(ledger: Any, task: str, run_id: str) -> dict[str, Any]:
    """The run minus the starting model on the validation examples both predicted: a paired
    bootstrap over examples (one seed on each side), the same statistics `compare` uses."""
    from tunepilot.experiments.compare_stats import hierarchical_bootstrap, make_scorer, stacked
    from tunepilot.experiments.eligibility import incomparable
    from tunepilot.ledger import BASELINE

    baseline = ledger.evaluations(run_id=BASELINE, split="validation")
    mine = ledger.evaluations(run_id=run_id, split="validation")
    if not baseline or not mine:
        return {"interval": None, "why": "no baseline evaluation (`tunepilot baseline`)"
                if not baseline else "the run has no validation evaluation"}  # fmt: skip
    b, r = baseline[-1], mine[-1]
    from types import SimpleNamespace

    reference = SimpleNamespace(run_id=run_id, eval_config_hash=r.eval_config_hash,
                                data_version=r.data_version, metrics=r.metrics)  # fmt: skip
    why = incomparable(b.eval_config_hash, b.data_version, reference, b.metrics)
    if why:
        return {"interval": None, "why": f"the baseline is not compared: {why}"}
    preds = [{p.example_id: p for p in ledger.predictions(e.id)} for e in (b, r)]
    ids = sorted(set(preds[0]) & set(preds[1]))
    if not ids:
        return {"interval": None, "why": "no example predicted by both"}
    scorer = make_scorer(task, [p for side in preds for p in side.values()])
    found = hierarchical_bootstrap(stacked(scorer, [preds[0]], ids),
                                   stacked(scorer, [preds[1]], ids), scorer.value, RESAMPLES,
                                   BOOTSTRAP_SEED)  # fmt: skip
    return {"interval": {"metric": scorer.metric, "diff": found.diff, "low": found.low,
                         "high": found.high, "p_value": found.p_value, "n_examples": len(ids),
                         "resamples": RESAMPLES, "level": LEVEL},
            "baseline_evaluation": b.id, "run_evaluation": r.id}  # fmt: skip
