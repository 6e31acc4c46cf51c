"""Length and template variants are compared with their control (S6, V2): the data version
separates the example set from its encoding, and an encoding that cut answers is not the same
experiment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunepilot.campaign import validate_mapping
from tunepilot.data.prepare import prepare_data
from tunepilot.data.version import version_parts
from tunepilot.data.workspace import Workspace
from tunepilot.experiments.compare import compare_ledger
from tunepilot.ledger import Ledger, Prediction
from tunepilot.tasks.metrics import classification_metrics

LABELS = ["refund", "delivery", "cancel"]
GOLD = [LABELS[i % 3] for i in range(60)]
IDS = [f"v{i}" for i in range(60)]

CAMPAIGN = """
name: enc
hypothesis: {behaviour: route tickets, task: classification}
model: {name_or_path: base}
data: {file: data.jsonl, fields: {label: label}}
variants:
  longer: {explain: room for long tickets, overrides: {data.max_length: 256}}
  shorter: {explain: cheaper steps, overrides: {data.max_length: 16}}
  other-data: {explain: more cleaning, overrides: {data.cleaning: [strip, lowercase]}}
seeds: [0, 1, 2]
"""


def preds(k: int) -> list[str]:
    """Predictions that miss the first k examples."""
    return [LABELS[(LABELS.index(g) + 1) % 3] if i < k else g for i, g in enumerate(GOLD)]


def add(ledger: Ledger, variant: str, seed: int, version: str, k: int, **cut: int) -> None:
    rid = ledger.register_run(campaign="enc", variant=variant, seed=seed,
                              config_hash=f"c-{variant}", data_version=version)  # fmt: skip
    ledger.set_status(rid, "running", "started")
    metrics = classification_metrics(GOLD, preds(k), LABELS) | cut
    rows = [Prediction(i, g, p, float(g == p), {"id": i, "gold": g, "pred": p})
            for i, g, p in zip(IDS, GOLD, preds(k), strict=True)]  # fmt: skip
    ledger.record_evaluation(rid, "validation", metrics, eval_config_hash="E1",
                             data_version=version, update=200, predictions=rows)  # fmt: skip
    ledger.set_status(rid, "completed", "budget reached")


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    (tmp_path / "campaign.yaml").write_text(CAMPAIGN, encoding="utf-8")
    return Workspace.open(tmp_path / "campaign.yaml")


def test_v2_a_max_length_variant_of_the_same_examples_is_compared(ws: Workspace):
    whole = {"answers_cut": 0, "train_answers_cut": 0}
    with Ledger.open(ws.ledger_path) as ledger:
        for seed in (0, 1, 2):
            add(ledger, "control", seed, "aaaaaaaaaaaaaaaa-11111111", 20 + seed, **whole)
            add(ledger, "longer", seed, "aaaaaaaaaaaaaaaa-22222222", 2 + seed, **whole)
        cmp = compare_ledger(ws.campaign, ledger)
    longer = next(v for v in cmp.variants if v.name == "longer")
    assert len(longer.used) == 3 and longer.ci is not None
    assert cmp.adopted == "longer", cmp.decision


def test_s6_an_encoding_that_cut_answers_is_not_the_same_experiment(ws: Workspace):
    with Ledger.open(ws.ledger_path) as ledger:
        add(ledger, "control", 0, "aaaaaaaaaaaaaaaa-11111111", 20,
            answers_cut=0, train_answers_cut=0)  # fmt: skip
        add(ledger, "shorter", 0, "aaaaaaaaaaaaaaaa-33333333", 0,
            answers_cut=3, train_answers_cut=40)  # fmt: skip
        add(ledger, "longer", 0, "aaaaaaaaaaaaaaaa-22222222", 0)  # nothing recorded: old run
        add(ledger, "other-data", 0, "bbbbbbbbbbbbbbbb-11111111", 0,
            answers_cut=0, train_answers_cut=0)  # fmt: skip
        cmp = compare_ledger(ws.campaign, ledger)
    why = {v.name: v.runs[0].excluded or "" for v in cmp.variants[1:]}
    assert "cuts the answers of 43 training/validation examples" in why["shorter"]
    assert "not the same experiment (S6)" in why["shorter"]
    assert "does not record whether max_length cut answers" in why["longer"]
    assert "other examples" in why["other-data"]
    assert cmp.adopted is None


def test_d1_the_data_version_keeps_the_examples_apart_from_their_encoding(tmp_path: Path):
    rows = [{"text": f"ticket {i} about order {i * 11}", "label": LABELS[i % 3]}
            for i in range(30)]  # fmt: skip
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")

    def version(**data) -> str:
        raw = {"name": "enc", "model": {"name_or_path": "base"},
               "hypothesis": {"behaviour": "b", "task": "classification"},
               "data": {"file": "data.jsonl", "fields": {"label": "label"}, **data}}  # fmt: skip
        return prepare_data(validate_mapping(raw), tmp_path, write=False).version

    base = version()
    longer = version(max_length=256)
    recleaned = version(cleaning=["strip", "lowercase"])
    assert version_parts(base)[0] == version_parts(longer)[0]  # same examples
    assert version_parts(base)[1] != version_parts(longer)[1]  # another encoding
    assert version_parts(base)[0] != version_parts(recleaned)[0]
    assert version_parts("0123456789abcdef") == ("0123456789abcdef", None)  # older versions


@pytest.mark.slow
def test_s6_max_length_variants_run_end_to_end_and_only_the_one_that_cut_answers_is_excluded(
    tmp_path: Path,
):
    from tunepilot.demo.campaign import write_demo_campaign
    from tunepilot.experiments import flow as run_flow

    overrides = {
        "training.budget.updates": 3, "training.eval_every": 3, "training.microbatch": 2,
        "training.accumulation": 1, "training.max_new_tokens": 8, "seeds": [0],
        # the tiny extraction demo's training examples need 50 to 97 tokens, prompts <= 66
        # (`tunepilot data show --json`, its tokenizer trained on the tickets and answers)
        "variants": {
            "longer": {"explain": "room for every answer", "overrides": {"data.max_length": 320}},
            "cut": {"explain": "cheaper steps", "overrides": {"data.max_length": 80}},
        },
    }  # fmt: skip
    path = write_demo_campaign(tmp_path, "extraction", tiny=True, n_conversations=40,
                               overrides=overrides)  # fmt: skip
    ws = Workspace.open(path)
    run_flow.run(ws, None, None, None, as_json=True)
    with Ledger.open(ws.ledger_path) as ledger:
        versions = {r.variant: r.data_version for r in ledger.list_runs()}
        cmp = compare_ledger(ws.campaign, ledger)
    assert len({version_parts(v)[0] for v in versions.values()}) == 1  # the same examples
    assert len({version_parts(v)[1] for v in versions.values()}) == 3  # three encodings
    runs = {v.name: v.runs[0] for v in cmp.variants}
    assert runs["longer"].excluded is None and runs["longer"].metrics["train_answers_cut"] == 0
    assert runs["cut"].metrics["train_answers_cut"] > 0
    assert "not the same experiment (S6)" in (runs["cut"].excluded or "")
