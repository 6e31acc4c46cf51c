"""A baseline is a reference for a class only where it knows something (H2, H3): a new head is
a random head, said so by `tunepilot baseline`, in the baseline's record and in the dossier,
and never a class-drop reference; a pretrained head is one only on the classes where it beats
always answering the majority class, beyond its bootstrap interval."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tunepilot.campaign import validate_mapping
from tunepilot.experiments.guards import baseline_reference, check_guards
from tunepilot.tasks.metrics import classification_metrics
from tunepilot.verdict import Verdict

CAMPAIGN = {
    "name": "sms", "hypothesis": {"behaviour": "Tell spam from ham.", "task": "classification",
                                  "classification_guards": {"max_class_drop": 0.05}},
    "model": {"name_or_path": "base-model", "method": "full"},
    "data": {"file": "sms.tsv", "format": "tsv", "quoting": False, "header": False,
             "columns": ["label", "text"], "fields": {"label": "label"},
             "split": {"policy": "stratified", "validation": 0.3, "test": 0.1}, "max_length": 32},
}  # fmt: skip


def rows_of(gold: list[str], pred: list[str]) -> list[dict]:
    return [{"id": str(i), "gold": g, "pred": p} for i, (g, p) in enumerate(zip(gold, pred,
                                                                              strict=True))]


def metrics_of(gold: list[str], pred: list[str], reference: dict | None = None) -> dict:
    out = classification_metrics(gold, pred, sorted(set(gold)))
    if reference is not None:
        out["reference"] = reference
    return out


@pytest.fixture(scope="module")
def sms_baseline(shared_data: Path, tiny_bert_dir: Path,
                 tmp_path_factory: pytest.TempPathFactory):  # fmt: skip
    """The real `tunepilot baseline` on 300 sms_spam rows with a tiny BERT whose head is new."""
    import shutil

    from tunepilot.data.workspace import Workspace
    from tunepilot.experiments import flow

    folder = tmp_path_factory.mktemp("sms")
    lines = (shared_data / "sms_spam" / "SMSSpamCollection").read_text().splitlines()
    (folder / "sms.tsv").write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")
    shutil.copytree(tiny_bert_dir, folder / "base-model")
    (folder / "campaign.yaml").write_text(json.dumps(CAMPAIGN))
    ws = Workspace.open(folder / "campaign.yaml")
    return ws, flow


@pytest.mark.realdata
def test_h3_a_new_heads_baseline_says_it_is_random_and_is_no_class_drop_reference(
    sms_baseline, capsys
) -> None:
    ws, flow = sms_baseline
    assert flow.baseline(ws, as_json=False) == 0
    said = capsys.readouterr().out
    assert "the baseline's head is new" in said and "classifier." in said
    record = json.loads((ws.root / "baseline" / "evaluation.json").read_text())
    reference = record["metrics"]["reference"]
    assert any(w.startswith("classifier.") for w in reference["new_weights"])
    # a control that loses every class against the random head's lucky scores
    gold = ["ham"] * 40 + ["spam"] * 10
    control = metrics_of(gold, ["spam"] * 50)
    guards = {f.check: f for f in check_guards(ws.campaign, control, record["metrics"], None)}
    drop = guards["guard: class drop vs baseline"]
    assert drop.verdict is Verdict.WARN and "not judged" in drop.sentence, drop.sentence
    assert "random head" in drop.sentence


def test_h3_class_drop_is_judged_only_where_the_baseline_beats_the_majority_class() -> None:
    """A pretrained head, strong on `refund` and `delivery`, lucky once on `fraud` (3
    examples): a variant that answers `delivery` to everything FAILs on the classes the
    baseline knew, and says `fraud` was not judged and why."""
    rng = random.Random(0)
    gold = ["refund"] * 60 + ["delivery"] * 30 + ["fraud"] * 3
    base_pred = [g if rng.random() < 0.9 else "delivery" for g in gold[:90]]
    base_pred += ["fraud", "delivery", "delivery"]  # one lucky hit out of three
    reference = baseline_reference(rows_of(gold, base_pred), new_weights=[])
    assert reference["majority_class"] == "refund"
    baseline = metrics_of(gold, base_pred, reference)
    variant = metrics_of(gold, ["delivery"] * 93)  # sinks refund and fraud
    campaign = validate_mapping(CAMPAIGN)
    guards = {f.check: f for f in check_guards(campaign, variant, baseline, None)}
    drop = guards["guard: class drop vs baseline"]
    assert drop.verdict is Verdict.FAIL
    assert sorted(drop.examples) == ["delivery", "refund"], drop.sentence
    assert "not judged against it: fraud" in drop.sentence
    assert drop.details["not_judged"] == ["fraud"]
    # the clean control: a variant as good as the baseline passes
    same = {f.check: f for f in check_guards(campaign, metrics_of(gold, base_pred), baseline,
                                             None)}  # fmt: skip
    assert same["guard: class drop vs baseline"].verdict is Verdict.PASS
