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
it and names the decision's number (`compare.decided` compares and keeps). An exported bundle
carries the decision that stands for the evidence at export time (deliver/comparison.py).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tunepilot.campaign import Campaign
from tunepilot.experiments.compare_stats import BOOTSTRAP_SEED, LEVEL, RESAMPLES
from tunepilot.experiments.decision import ALPHA, MIN_SEEDS


def evidence_of(cmp: Any, campaign: Campaign, ledger: Any) -> dict[str, Any]:
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


def record_comparison(ledger: Any, campaign: Campaign, cmp: Any) -> tuple[Any, bool]:
    """Keep `cmp`'s decision in the ledger unless the latest decision already says it on the
    same evidence; returns (the `Decision` that stands, whether it is new)."""
    evidence = evidence_of(cmp, campaign, ledger)
    body = cmp.to_json() | {"evidence": evidence}
    return ledger.record_decision(evidence_digest(evidence), cmp.decision, cmp.adopted, body)
