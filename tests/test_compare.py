"""Comparison and decision (V2, V3, V5-V7, H2) on ledgers built by hand: fast, no training.

Runs, statuses, evaluations and per-example predictions go through the real Ledger API in
shape the runner writes them (row = the evaluate() row; score = correct).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tunepilot.data.workspace import Workspace
from tunepilot.experiments.compare import compare_command, compare_ledger
from tunepilot.experiments.compare_stats import hierarchical_bootstrap, make_scorer, stacked
from tunepilot.ledger import BASELINE, Ledger, Prediction
from tunepilot.tasks.metrics import classification_metrics, extraction_metrics
from tunepilot.verdict import Verdict

LABELS = ["refund", "delivery", "cancel"]
GOLD = [LABELS[i % 3] for i in range(60)]
IDS = [f"v{i}" for i in range(60)]

CAMPAIGN = """
name: cmp
hypothesis:
  behaviour: route tickets
  task: classification
  classification_guards: {max_class_drop: 0.05}
model: {name_or_path: base}
data: {file: data.jsonl, fields: {label: label}}
variants:
  better: {explain: more lr, overrides: {training.lr: 2.0e-4}}
  same: {explain: less lr, overrides: {training.lr: 5.0e-5}}
seeds: [0, 1]
"""


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    (tmp_path / "campaign.yaml").write_text(CAMPAIGN, encoding="utf-8")
    return Workspace.open(tmp_path / "campaign.yaml")


def predictions(preds: list[str], ids: list[str] = IDS, gold: list[str] = GOLD) -> list:
    return [
        Prediction(i, g, p, float(g == p), {"id": i, "gold": g, "pred": p, "correct": g == p})
        for i, g, p in zip(ids, gold, preds, strict=True)
    ]


def wrong_on(k: int, cls: str | None = None, to: str | None = None) -> list[str]:
    """Predictions that miss the first k examples (of class `cls` only, when given), predicting
    `to` for them, or the next label."""
    out, missed = [], 0
    for g in GOLD:
        hit = missed < k and (cls is None or g == cls)
        missed += hit
        out.append((to or LABELS[(LABELS.index(g) + 1) % 3]) if hit else g)
    return out


def add_run(
    ledger: Ledger,
    variant: str,
    seed: int,
    preds: list[str] | None,
    status: str = "completed",
    reason: str = "",
    eval_hash: str = "E1",
    data_version: str = "D1",
) -> str:
    rid = ledger.register_run(
        campaign="cmp", variant=variant, seed=seed, config_hash=f"c-{variant}",
        data_version=data_version,
    )  # fmt: skip
    ledger.set_status(rid, "running", "started")
    if preds is not None:
        metrics = classification_metrics(GOLD, preds, LABELS)
        ledger.record_evaluation(
            rid, "validation", metrics, eval_config_hash=eval_hash, data_version=data_version,
            update=200, predictions=predictions(preds),
        )  # fmt: skip
    ledger.set_status(rid, status, reason)
    return rid


def add_baseline(ledger: Ledger, preds: list[str], eval_hash: str = "E1") -> None:
    ledger.record_evaluation(
        BASELINE, "validation", classification_metrics(GOLD, preds, LABELS),
        eval_config_hash=eval_hash, data_version="D1", update=0, predictions=predictions(preds),
    )  # fmt: skip


def variant(cmp, name):
    return next(v for v in cmp.variants if v.name == name)


# -- the bootstrap ----------------------------------------------------------------------------


def test_v6_bootstrap_identical_variant_ci_contains_zero_and_better_one_lies_above():
    control = predictions(wrong_on(20))
    scorer = make_scorer("classification", control)
    c = stacked(scorer, [{p.example_id: p for p in control}], IDS)
    same = hierarchical_bootstrap(c, c.copy(), scorer.value, 2000, seed=0)
    assert same.diff == 0 and same.low <= 0 <= same.high
    noisy = predictions(wrong_on(19))  # one example better: noise, not a finding
    v = stacked(scorer, [{p.example_id: p for p in noisy}], IDS)
    found = hierarchical_bootstrap(c, v, scorer.value, 2000, seed=0)
    assert found.low <= 0 <= found.high
    good = predictions(wrong_on(2))  # 18 more examples right out of 60
    g = stacked(scorer, [{p.example_id: p for p in good}], IDS)
    found = hierarchical_bootstrap(c, g, scorer.value, 2000, seed=0)
    assert 0 < found.low < found.diff < found.high and found.p_value < 0.01
    assert hierarchical_bootstrap(c, g, scorer.value, 2000, seed=0) == found  # seeded
    assert hierarchical_bootstrap(c, g, scorer.value, 2000, seed=1) != found


def test_v6_bootstrap_statistic_reproduces_the_evaluation_metric_exactly():
    preds = wrong_on(7, "refund") + []
    preds[5] = "refund"  # a false positive too, so precision and recall differ
    rows = predictions(preds)
    scorer = make_scorer("classification", rows)
    sums = np.ones((1, len(IDS))) @ stacked(scorer, [{p.example_id: p for p in rows}], IDS)[0]
    expected = classification_metrics(GOLD, preds, LABELS)["macro_f1"]
    assert scorer.value(sums)[0] == pytest.approx(expected, abs=1e-12)
    gold = [{"order_id": str(i), "city": "Paris"} if i % 2 else {"order_id": str(i)}
            for i in range(6)]  # fmt: skip
    outputs = [
        '{"order_id": "0"}',
        '{"order_id": "9", "city": "Paris"}',
        "nope",
        '{"order_id": "3", "city": "Rome"}',
        '{"order_id": "4"}',
        '{"city": "Paris"}',
    ]
    ids = [str(i) for i in range(6)]
    scored = extraction_metrics(gold, outputs, ["order_id"], None, ids=ids)
    ext = [Prediction(r["id"], None, None, float(r["exact"]), r) for r in scored["rows"]]
    scorer = make_scorer("extraction", ext)
    sums = np.ones((1, 6)) @ stacked(scorer, [{p.example_id: p for p in ext}], ids)[0]
    assert scorer.metric == "field_token_f1_macro"
    assert scorer.value(sums)[0] == pytest.approx(scored["metrics"]["field_token_f1_macro"])


# -- decisions ----------------------------------------------------------------------------------


def test_v6_clearly_better_variant_is_adopted_with_its_interval(ws: Workspace):
    with Ledger.open(ws.ledger_path) as ledger:
        add_baseline(ledger, wrong_on(40))
        for seed in (0, 1):
            add_run(ledger, "control", seed, wrong_on(20 + seed))
            add_run(ledger, "better", seed, wrong_on(2 + seed))
        cmp = compare_ledger(ws.campaign, ledger)
    better = variant(cmp, "better")
    assert better.ci is not None and better.ci["low"] > 0
    assert better.ci["seeds"] == [0, 1] and better.ci["n_examples"] == 60
    assert all(f.verdict is not Verdict.FAIL for f in better.guards)
    assert cmp.adopted == "better"
    assert cmp.decision.startswith("Adopt `better`: macro_f1 +")


def test_v6_mean_and_std_cover_every_seed_never_only_the_best(ws: Workspace):
    with Ledger.open(ws.ledger_path) as ledger:
        for seed, k in ((0, 20), (1, 10), (2, 30)):
            add_run(ledger, "control", seed, wrong_on(k))
        cmp = compare_ledger(ws.campaign, ledger)
    acc = variant(cmp, "control").summary["accuracy"]
    assert acc["values"] == {"0": 40 / 60, "1": 50 / 60, "2": 30 / 60}
    assert acc["mean"] == pytest.approx(40 / 60)
    assert acc["std"] == pytest.approx(np.std([40 / 60, 50 / 60, 30 / 60], ddof=1))


def test_v7_control_remains_best_keep_the_control_is_a_decision_exit_0(ws: Workspace, capsys):
    with Ledger.open(ws.ledger_path) as ledger:
        add_baseline(ledger, wrong_on(30))
        for seed in (0, 1):
            add_run(ledger, "control", seed, wrong_on(5))
            add_run(ledger, "same", seed, wrong_on(6))
    assert compare_command(ws, as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["adopted"] is None
    assert out["decision"].startswith("Keep the control: `better`: no comparable completed run")
    assert "`same`: its gain is not a finding: macro_f1" in out["decision"]
    assert "valid, re-readable conclusion (V7)" in out["decision"]
    saved = json.loads((ws.root / "comparison.json").read_text(encoding="utf-8"))
    assert saved["decision"] == out["decision"]


def test_h2_better_mean_but_one_class_below_the_baseline_is_not_adopted(ws: Workspace):
    with Ledger.open(ws.ledger_path) as ledger:
        # at the start delivery is often taken for refund; cancel is perfect
        add_baseline(ledger, wrong_on(8, "delivery", to="refund"))
        for seed in (0, 1):
            add_run(ledger, "control", seed, wrong_on(20))
            # much better overall, refund keeps its precision, but cancel is lost to refund
            add_run(ledger, "better", seed, wrong_on(8, "cancel", to="refund"))
        cmp = compare_ledger(ws.campaign, ledger)
    better = variant(cmp, "better")
    assert better.ci is not None and better.ci["low"] > 0  # the mean clearly improved
    failing = [f for f in better.guards if f.verdict is Verdict.FAIL]
    assert [f.check for f in failing] == ["guard: class drop vs baseline"]
    assert failing[0].examples == ["cancel"]
    assert cmp.adopted is None
    assert "fails guard: class drop vs baseline (class `cancel` F1" in cmp.decision
    assert better.deltas["vs_baseline"]["cancel"] < -0.05


def test_v3_diverged_interrupted_failed_and_invalid_runs_keep_their_line_and_reason(
    ws: Workspace, capsys
):
    with Ledger.open(ws.ledger_path) as ledger:
        for seed in (0, 1):
            add_run(ledger, "control", seed, wrong_on(20))
        add_run(ledger, "better", 0, None, "diverged", "update 3: loss 31.2 > stop.max_loss")
        add_run(ledger, "better", 1, None, "interrupted", "paused after update 40 (stop_after)")
        add_run(ledger, "same", 0, wrong_on(19))
        add_run(ledger, "same", 1, None, "failed", "RuntimeError: out of memory")
        bad = add_run(ledger, "same", 2, wrong_on(1))
        ledger.set_status(bad, "invalid", "trained on a leaked split")
    assert compare_command(ws, as_json=False) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())  # without table borders
    for words in ("update 3: loss 31.2 > stop.max_loss", "paused after update 40",
                  "RuntimeError: out of memory", "trained on a leaked split"):  # fmt: skip
        assert words in text
    saved = json.loads((ws.root / "comparison.json").read_text(encoding="utf-8"))
    lines = {r["run_id"]: r for v in saved["variants"] for r in v["runs"]}
    assert len(lines) == 7  # nothing dropped
    assert lines["better-s0-1"]["excluded"].startswith("diverged: update 3")
    assert lines["better-s1-1"]["excluded"].startswith("interrupted: paused")
    assert lines["same-s2-1"]["excluded"] == "invalid: trained on a leaked split"
    assert "seed 2" not in saved["decision"]  # declared invalid with a reason: not a blocker
    assert saved["adopted"] is None
    assert "`better`: no comparable completed run" in saved["decision"]
    assert (
        "`same`: seed 1 has no comparable completed run (failed: RuntimeError"
        in (saved["decision"])
    )


def test_v2_runs_under_another_eval_config_or_data_version_are_not_compared(ws: Workspace):
    with Ledger.open(ws.ledger_path) as ledger:
        add_baseline(ledger, wrong_on(30), eval_hash="E0")
        add_run(ledger, "control", 0, wrong_on(20))
        add_run(ledger, "better", 0, wrong_on(1), eval_hash="E2")
        add_run(ledger, "same", 0, wrong_on(1), data_version="D2")
        cmp = compare_ledger(ws.campaign, ledger)
    better, same = variant(cmp, "better"), variant(cmp, "same")
    assert not better.used and not same.used and better.ci is None
    assert better.runs[0].excluded.startswith("not compared: evaluated with eval config E2 but")
    assert "control (control-s0-1) with E1" in better.runs[0].excluded
    assert "data version D2 but the control (control-s0-1) used D1" in same.runs[0].excluded
    assert any(n.startswith("the baseline is not compared: evaluated with eval config E0")
               for n in cmp.notes)  # fmt: skip
    assert cmp.adopted is None and cmp.decision.startswith("Keep the control")


def test_v6_a_variant_with_no_seed_in_common_with_the_control_is_not_adopted(ws: Workspace):
    with Ledger.open(ws.ledger_path) as ledger:
        add_run(ledger, "control", 0, wrong_on(20))
        add_run(ledger, "better", 1, wrong_on(0))
        cmp = compare_ledger(ws.campaign, ledger)
    assert variant(cmp, "better").ci is None
    assert "no seed in common with the control (control seeds [0])" in cmp.decision


def test_compare_exits_2_when_the_control_has_no_completed_run(ws: Workspace, capsys):
    assert compare_command(ws, as_json=False) == 2  # an empty ledger
    assert "Nothing to compare" in capsys.readouterr().out
    with Ledger.open(ws.ledger_path) as ledger:
        add_run(ledger, "control", 0, None, "diverged", "update 1: loss nan")
        add_run(ledger, "better", 0, wrong_on(0))
    assert compare_command(ws, as_json=True) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["comparable"] is False
    assert out["variants"][0]["runs"][0]["excluded"] == "diverged: update 1: loss nan"
    assert not (ws.root / "comparison.json").exists()


def test_h2_v6_extraction_runs_are_compared_on_field_f1_with_format_guards(tmp_path: Path):
    from tunepilot.campaign import validate_mapping

    campaign = validate_mapping(
        {
            "name": "ext",
            "hypothesis": {"behaviour": "extract", "task": "extraction",
                           "required_fields": ["order_id"]},
            "model": {"name_or_path": "base"},
            "data": {"file": "d.jsonl", "fields": {"target": "target"}},
            "variants": {"v": {"explain": "more lr", "overrides": {"training.lr": 2e-4}}},
        }
    )  # fmt: skip
    gold = [{"order_id": str(i), "city": "Paris"} for i in range(40)]
    ids = [f"x{i}" for i in range(40)]
    control_out = ["not json"] * 20 + [json.dumps({"order_id": str(i)}) for i in range(20, 40)]
    variant_out = [json.dumps(g) for g in gold]
    with Ledger.open(tmp_path) as ledger:
        for name, outputs, seed in (("control", control_out, 0), ("v", variant_out, 0),
                                    ("control", control_out, 1), ("v", variant_out, 1)):
            scored = extraction_metrics(gold, outputs, ["order_id"], None, ids=ids)
            rid = ledger.register_run(campaign="ext", variant=name, seed=seed, config_hash="c",
                                      data_version="D1", status="running")  # fmt: skip
            ledger.record_evaluation(
                rid, "validation", scored["metrics"], eval_config_hash="E1", data_version="D1",
                predictions=[Prediction(r["id"], None, None, float(r["exact"]), r)
                             for r in scored["rows"]],
            )  # fmt: skip
            ledger.set_status(rid, "completed", "")
        cmp = compare_ledger(campaign, ledger)
    control, v = cmp.variants
    assert control.summary["json_validity"]["mean"] == 0.5
    checks = {f.check: f.verdict for f in control.guards}
    assert checks["guard: json validity"] is Verdict.FAIL  # 50% < the default 95%
    assert v.ci is not None and v.ci["metric"] == "field_token_f1_macro" and v.ci["low"] > 0
    assert v.deltas["vs_control"]["city"] == pytest.approx(1.0)
    assert cmp.adopted == "v"


# -- seeds, one seed, several variants (V6) ------------------------------------------------------


def test_v6_seed_to_seed_variance_is_in_the_interval_a_lucky_seed_is_not_adopted(ws: Workspace):
    """Seed 0 of the variant is far better than the control, seed 1 worse: pooled over seeds and
    resampled by example only, the interval lay above 0; resampling seeds too, it does not."""
    with Ledger.open(ws.ledger_path) as ledger:
        for seed, k in ((0, 2), (1, 24)):
            add_run(ledger, "control", seed, wrong_on(20))
            add_run(ledger, "better", seed, wrong_on(k))
        cmp = compare_ledger(ws.campaign, ledger)
    better = variant(cmp, "better")
    assert better.ci["diff"] > 0.1 and better.ci["low"] < 0 < better.ci["high"]
    assert better.ci["p_value"] > 0.2 and cmp.adopted is None
    assert "seeds and examples" in better.ci["method"]


def test_v6_one_seed_never_adopts_and_the_decision_says_it_rests_on_one_seed(ws: Workspace):
    with Ledger.open(ws.ledger_path) as ledger:
        add_run(ledger, "control", 0, wrong_on(20))
        add_run(ledger, "better", 0, wrong_on(2))  # a large gain, on one seed only
        cmp = compare_ledger(ws.campaign, ledger)
    better = variant(cmp, "better")
    assert better.ci["low"] > 0 and better.ci["seeds"] == [0]
    assert cmp.adopted is None
    assert "`better`: the evidence rests on one seed" in cmp.decision
    assert "one seed (0)" in cmp.decision and "--seeds" in cmp.decision


def test_v6_holm_adjusts_for_the_number_of_variants_compared(tmp_path: Path):
    from tunepilot.campaign import validate_mapping
    from tunepilot.experiments.compare_stats import holm

    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx(
        {"a": 0.03, "c": 0.06, "b": 0.06})  # fmt: skip
    assert holm({"a": 0.5}) == {"a": 0.5}

    def decide_with(names: list[str]) -> object:
        raw = yaml_campaign(names)
        with Ledger.open(tmp_path / f"{len(names)}.db") as ledger:
            for seed in (0, 1):
                add_run(ledger, "control", seed, wrong_on(20))
                for name in names:  # a gain with a one-sided p just under 0.025 on its own
                    add_run(ledger, name, seed, wrong_on(16))
            return compare_ledger(validate_mapping(raw), ledger)

    alone = decide_with(["v1"])
    assert alone.adopted == "v1" and variant(alone, "v1").ci["p_holm"] < 0.025
    three = decide_with(["v1", "v2", "v3"])
    ci = variant(three, "v1").ci
    assert ci["compared"] == 3 and ci["p_holm"] == pytest.approx(min(1.0, 3 * ci["p_value"]))
    assert three.adopted is None and "Holm-adjusted p" in three.decision


def yaml_campaign(names: list[str]) -> dict:
    import yaml

    raw = yaml.safe_load(CAMPAIGN)
    raw["variants"] = {n: {"explain": "lr", "overrides": {"training.lr": 1e-5 * (i + 2)}}
                       for i, n in enumerate(names)}  # fmt: skip
    return raw


def test_v7_compare_exits_1_when_the_kept_control_fails_its_guards(ws: Workspace, capsys):
    with Ledger.open(ws.ledger_path) as ledger:
        add_baseline(ledger, wrong_on(0))  # the starting model is perfect: every run drops
        for seed in (0, 1):
            add_run(ledger, "control", seed, wrong_on(30))
            add_run(ledger, "same", seed, wrong_on(30))
    assert compare_command(ws, as_json=True) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["adopted"] is None and "the control itself fails" in out["decision"]
