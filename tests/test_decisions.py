"""L4, V7: every decision `compare` reaches is kept in the ledger and its notebook with the
digest of its evidence, history kept, and the dossier shows them all; comparison.json is only
the latest view. Ledgers built by hand through the real Ledger API (test_compare's helpers).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest

from test_compare import CAMPAIGN, add_baseline, add_run, wrong_on
from tunepilot.data.workspace import Workspace
from tunepilot.experiments.compare import compare_command
from tunepilot.ledger import Ledger


@pytest.fixture
def ws(tmp_path) -> Workspace:
    (tmp_path / "campaign.yaml").write_text(CAMPAIGN, encoding="utf-8")
    return Workspace.open(tmp_path / "campaign.yaml")


def _decisions(ws: Workspace) -> tuple[list, list]:
    with Ledger.open(ws.ledger_path) as ledger:
        return ledger.decisions(), ledger.notes()


def test_l4_every_decision_is_kept_with_its_evidence_digest_and_history_is_never_replaced(
    ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    with Ledger.open(ws.ledger_path) as ledger:
        add_baseline(ledger, wrong_on(30))
        for seed in (0, 1):
            add_run(ledger, "control", seed, wrong_on(20))
            add_run(ledger, "better", seed, wrong_on(2))
    assert compare_command(ws, as_json=False) == 0
    assert "decision #1 recorded in the notebook" in capsys.readouterr().out
    (first,), notes = _decisions(ws)
    assert first.id == 1 and first.adopted == "better" and first.decision.startswith("Adopt")
    text = json.dumps(first.body["evidence"], sort_keys=True, separators=(",", ":"))
    assert first.evidence_sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert [n.text for n in notes if n.id == first.note_id][0].startswith(
        f"decision #1 (compare, evidence sha256 {first.evidence_sha256[:16]}): adopt `better`.")
    saved = json.loads((ws.root / "comparison.json").read_text(encoding="utf-8"))
    assert saved["decision_record"]["id"] == 1

    # the same evidence again: nothing new; a run still training adds no number either
    assert compare_command(ws, as_json=False) == 0
    assert "the same evidence and conclusion as decision #1" in capsys.readouterr().out
    with Ledger.open(ws.ledger_path) as ledger:
        running = ledger.register_run(campaign="cmp", variant="same", seed=0, config_hash="c",
                                      data_version="D1", status="running")  # fmt: skip
        ledger.heartbeat(running, pid=__import__("os").getpid())
    assert compare_command(ws, as_json=True) == 0
    capsys.readouterr()
    assert len(_decisions(ws)[0]) == 1

    # new evidence: decision #2, and #1 stays as it was
    with Ledger.open(ws.ledger_path) as ledger:
        ledger.set_status(running, "failed", "RuntimeError: out of memory")
        add_run(ledger, "control", 2, wrong_on(20))
        add_run(ledger, "better", 2, wrong_on(30))  # seed 2 no longer confirms the gain
    compare_command(ws, as_json=True)
    second = json.loads(capsys.readouterr().out)
    decisions, notes = _decisions(ws)
    assert [d.id for d in decisions] == [1, 2] and decisions[0] == first
    assert decisions[1].evidence_sha256 != first.evidence_sha256
    assert second["decision_record"]["id"] == 2 and decisions[1].decision == second["decision"]
    assert sum(n.text.startswith("decision #") for n in notes) == 2
    con = sqlite3.connect(ws.ledger_path)
    with pytest.raises(sqlite3.DatabaseError, match="keeps every row"):
        con.execute("UPDATE decisions SET decision = 'rewritten'")
    con.close()


def test_l4_the_dossier_shows_every_decision_and_which_one_comparison_json_holds(
    ws: Workspace,
) -> None:
    from tunepilot.report.collect import collect
    from tunepilot.report.results import comparison

    with Ledger.open(ws.ledger_path) as ledger:
        for seed in (0, 1):
            add_run(ledger, "control", seed, wrong_on(20))
            add_run(ledger, "better", seed, wrong_on(2))
    compare_command(ws, as_json=True)
    with Ledger.open(ws.ledger_path) as ledger:
        add_run(ledger, "same", 0, wrong_on(20))
        add_run(ledger, "same", 1, wrong_on(21))
    compare_command(ws, as_json=True)
    d = collect(ws)
    assert [x["id"] for x in d["decisions"]] == [1, 2]
    html = comparison(d)
    history = html[html.index("Every decision, with its evidence (L4)"):]
    assert history.index("2 (comparison.json)") < history.index("<td>1</td>")  # newest first
    for x in d["decisions"]:
        assert x["evidence_sha256"][:16] in history
    assert sum("decision #" in n["text"] for n in d["notes"]) == 2  # the notebook has them too


def test_l5_the_bundle_carries_the_decision_and_the_run_against_control_and_baseline(
    tmp_path,
) -> None:
    """One real trained run of a variant (exported), the other seeds and the baseline written
    through the Ledger API on the same validation examples: the bundle's comparison.json and
    its card hold the decision that stands, intervals against the control and the baseline,
    every seed's value and each run's line."""
    import yaml

    from test_export import train_run, write_campaign
    from tunepilot.deliver.export import export_run
    from tunepilot.experiments.runner import Session, execute_run
    from tunepilot.ledger import BASELINE, Prediction
    from tunepilot.tasks.metrics import classification_metrics

    campaign = write_campaign(tmp_path / "camp", "classification")
    spec = yaml.safe_load(campaign.read_text())
    spec["variants"] = {"lr-hi": {"explain": "a larger step", "overrides": {"training.lr": 0.02}}}
    spec["seeds"] = [0, 1]
    campaign.write_text(yaml.safe_dump(spec, sort_keys=False))
    ws, control0 = train_run(campaign)
    with Ledger.open(ws.ledger_path) as ledger:
        real = execute_run(Session(ws), ledger, "lr-hi", 0, progress=False).run_id
        mine = ledger.evaluations(run_id=real, split="validation")[-1]
        rows = [p.row for p in ledger.predictions(mine.id)]
        labels = sorted({r["gold"] for r in rows})

        def record(run_id: str, wrong: int) -> None:
            made = [dict(r, pred=r["gold"] if i >= wrong else labels[labels.index(r["gold"]) - 1])
                    for i, r in enumerate(rows)]  # fmt: skip
            for r in made:
                r["correct"] = r["pred"] == r["gold"]
            metrics = classification_metrics([r["gold"] for r in made],
                                             [r["pred"] for r in made], labels)  # fmt: skip
            preds = [Prediction(r["id"], r["gold"], r["pred"], float(r["correct"]), r)
                     for r in made]  # fmt: skip
            ledger.record_evaluation(run_id, "validation", metrics | {"train_answers_cut": 0},
                                     eval_config_hash=mine.eval_config_hash,
                                     data_version=mine.data_version, update=2,
                                     predictions=preds)  # fmt: skip

        record(BASELINE, len(rows))  # the starting model gets every example wrong
        for variant in ("control", "lr-hi"):
            rid = ledger.register_run(campaign=ws.campaign.name, variant=variant, seed=1,
                                      config_hash="c", data_version=mine.data_version,
                                      status="running")  # fmt: skip
            record(rid, 2 if variant == "lr-hi" else 6)
            ledger.set_status(rid, "completed", "finished its budget")
    bundle = export_run(ws, real)
    cmp = json.loads((bundle / "comparison.json").read_text(encoding="utf-8"))
    (decision,), _ = _decisions(ws)
    assert cmp["decision"]["id"] == decision.id
    assert cmp["decision"]["evidence_sha256"] == decision.evidence_sha256
    assert cmp["decision"]["decision"] == decision.decision
    assert (cmp["run_id"], cmp["variant"], cmp["seed"]) == (real, "lr-hi", 0)
    assert cmp["chosen"] == (decision.adopted == "lr-hi")
    ci = cmp["vs_control"]["interval"]
    assert ci["seeds"] == [0, 1] and ci["low"] <= ci["diff"] <= ci["high"]
    base = cmp["vs_baseline"]["interval"]
    assert base["n_examples"] == len(rows) and base["diff"] > 0 and base["low"] <= base["high"]
    assert set(cmp["seeds"]) == {"control", "lr-hi"}
    assert set(cmp["seeds"]["lr-hi"]["summary"]["macro_f1"]["values"]) == {"0", "1"}
    assert {r["run_id"] for r in cmp["seeds"]["control"]["runs"]} >= {control0}
    readme = (bundle / "README.md").read_text(encoding="utf-8")
    assert f"Decision #{decision.id} of the campaign's notebook" in readme
    assert f"Against the control: macro\\_f1 {ci['diff']:+.4f}" in readme
    assert f"Against the baseline: macro\\_f1 {base['diff']:+.4f}" in readme
    assert "`lr-hi` macro\\_f1 per seed: seed 0:" in readme
