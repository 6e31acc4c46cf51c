"""The starting model's evaluation (H3): the baseline every variant is compared with.

Kept in full (metrics, per-example predictions, the evaluation config) in the ledger and in
`baseline/`, with what it can be a reference for: a classification head that is new is a
random head, and a class it does no better on than always answering the majority class has
nothing to lose (`guards.baseline_reference`).
"""

from __future__ import annotations

import json
from typing import Any

from tunepilot.experiments.runner import Session, predictions_from_rows


def run_baseline(session: Session, ledger: Any) -> Any:
    """H3: the starting model on the validation split, before any training, kept in full.

    The hypothesis and guards are fixed in the ledger at this moment (H1): changing them later
    is an amendment with a reason, never a silent edit.
    """
    from tunepilot.experiments.guards import baseline_reference
    from tunepilot.ledger import BASELINE

    ws = session.ws
    campaign = ws.campaign
    ledger.fix_hypothesis(campaign.hypothesis.model_dump(mode="json"))
    model = session.build_model(campaign, campaign.training.seed)
    result = session.evaluate(model, campaign, label="baseline evaluation")
    if campaign.hypothesis.is_classification:  # what the baseline can be a reference for
        result.metrics["reference"] = baseline_reference(result.rows, session.new_weights)
    ledger.record_evaluation(
        BASELINE, "validation", result.metrics, eval_config_hash=result.config_hash,
        data_version=session.encoded(campaign).prepared.version, update=0,
        predictions=predictions_from_rows(result.rows),
    )  # fmt: skip
    out = ws.root / "baseline"
    out.mkdir(exist_ok=True)
    (out / "evaluation.json").write_text(json.dumps(
        {"metrics": result.metrics, "config": result.config, "config_hash": result.config_hash},
        indent=2, default=str), encoding="utf-8")  # fmt: skip
    with (out / "predictions.jsonl").open("w", encoding="utf-8") as handle:
        for row in result.rows:
            handle.write(json.dumps(row, default=str) + "\n")
    return result
