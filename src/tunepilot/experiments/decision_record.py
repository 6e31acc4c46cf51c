"""What a decision rests on, keeping it in the notebook, and the slice a bundle carries (L4, L5).

`compare` decides (decision.py); this module keeps what it decided. The evidence of a decision
is what its numbers come from: the evaluation row behind every run the comparison used, the
baseline evaluation it judged the guards against, the hypothesis (the guards are part of it),
the decision rule's constants and the bootstrap's resamples and seed. Evaluation rows are never
rewritten, so the same evidence always gives the same numbers; its sha256 is the decision's
evidence digest. A run still training, failing or interrupted adds no number, so it does not
change the evidence: the decision it would overturn is recorded when it completes.

Every decision goes to the ledger (`Ledger.record_decision`: a notebook entry and a
`decisions` row, history kept); comparison.json in the campaign folder is the latest view of
it and names the decision's number. An exported bundle carries the decision that stands for
the evidence at export time (`bundle_comparison`): the exported run's variant against the
control and the baseline, with intervals and seeds, read from the recorded decision, so a
restored copy of the campaign exports the very same bytes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tunepilot.campaign import Campaign
from tunepilot.campaign.variants import CONTROL
from tunepilot.experiments.compare import BOOTSTRAP_SEED, Comparison, compare_ledger
from tunepilot.experiments.compare_stats import LEVEL, RESAMPLES
from tunepilot.experiments.decision import ALPHA, MIN_SEEDS

BUNDLE_FORMAT = "tunepilot-comparison/1"


def evidence_of(cmp: Comparison, campaign: Campaign, ledger: Any) -> dict[str, Any]:
    """The inputs a decision's numbers come from (see the module docstring)."""
    from tunepilot.campaign import stable_hash
    from tunepilot.ledger import BASELINE

    baseline = ledger.evaluations(run_id=BASELINE, split="validation")
    return {
        "used": sorted([v.name, x.run_id, x.evaluation_id] for v in cmp.variants for x in v.used),
        "baseline_evaluation": baseline[-1].id if baseline else None,
        "reference": cmp.reference,
        "metric": cmp.metric,
        "hypothesis": stable_hash(campaign.hypothesis.model_dump(mode="json")),
        "rule": {"min_seeds": MIN_SEEDS, "alpha": ALPHA, "level": LEVEL},
        "bootstrap": {"resamples": RESAMPLES, "seed": BOOTSTRAP_SEED},
    }


def evidence_digest(evidence: dict[str, Any]) -> str:
    text = json.dumps(evidence, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_comparison(ledger: Any, campaign: Campaign, cmp: Comparison) -> tuple[Any, bool]:
    """Keep `cmp`'s decision in the ledger unless the latest decision already says it on the
    same evidence; returns (the `Decision` that stands, whether it is new)."""
    evidence = evidence_of(cmp, campaign, ledger)
    body = cmp.to_json() | {"evidence": evidence}
    return ledger.record_decision(evidence_digest(evidence), cmp.decision, cmp.adopted, body)


def decided(ws: Any) -> tuple[Comparison, Any | None, bool]:
    """Compare the campaign folder's runs and keep the decision: (comparison, the Decision
    that stands or None when there is nothing to compare, whether it was new)."""
    from tunepilot.ledger import Ledger

    with Ledger.open(ws.ledger_path) as ledger:  # marks runs whose process died (V3)
        cmp = compare_ledger(ws.campaign, ledger)
        cmp.notes += [f"marked {d.run_id} interrupted: {d.reason}"
                      for d in ledger.interrupted_on_open]  # fmt: skip
        if not cmp.comparable:
            return cmp, None, False
        decision, new = record_comparison(ledger, ws.campaign, cmp)
    return cmp, decision, new


# --------------------------------------------------------------------------------------------
# the slice a bundle carries (L5)
# --------------------------------------------------------------------------------------------


def bundle_comparison(ws: Any, run_id: str) -> dict[str, Any]:
    """comparison.json of a bundle: the decision that stands, and the exported run's variant
    against the control and the baseline, with intervals, seeds and every run's line."""
    from tunepilot.ledger import Ledger

    cmp, decision, _ = decided(ws)
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
