"""The sealed test split (H4): every look counted before it is read, a second look warns loudly
and is recorded, a `refuse` policy keeps the seal closed. Real tiny-BERT runs, real ledger."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from test_sweep import write_sweep_campaign
from tunepilot.data.workspace import Workspace
from tunepilot.errors import InputError
from tunepilot.experiments.sealed_test import final_test
from tunepilot.ledger import BASELINE, Ledger


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory: pytest.TempPathFactory, tiny_bert_dir: Path) -> Path:
    """A campaign folder with one completed control run and one diverged run, trained once."""
    from tunepilot.experiments.runner import Session, execute_run

    path = write_sweep_campaign(tmp_path_factory.mktemp("sealed") / "c", tiny_bert_dir)
    ws = Workspace.open(path)
    session = Session(ws)
    with Ledger.open(ws.ledger_path) as ledger:
        assert execute_run(session, ledger, "control", 0, progress=False).status == "completed"
        assert execute_run(session, ledger, "lr-huge", 0, progress=False).status == "diverged"
    return path


@pytest.fixture
def trained(trained_once: Path, tmp_path: Path) -> Path:
    """A fresh copy of that folder (ledger included) per test, so looks never carry over."""
    copy = tmp_path / "c"
    shutil.copytree(trained_once.parent, copy)
    return copy / "campaign.yaml"


def flat(text: str) -> str:
    """Terminal output as one line, without the panel's borders (Rich wraps long lines)."""
    return " ".join(text.replace("│", " ").split())


def sealed_ids(path: Path) -> set[str]:
    return set(json.loads((path.parent / "data" / "test_seal.json").read_text())["ids"])


def test_h4_first_look_is_counted_and_the_test_split_evaluated_with_predictions(
    trained: Path, capsys
):
    ws = Workspace.open(trained)
    assert final_test(ws, "control-s0-1", as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["look"] == 1 and out["warning"] is None
    with Ledger.open(ws.ledger_path) as ledger:
        looks = ledger.test_looks()
        tests = ledger.evaluations(split="test")
        validation = ledger.evaluations(run_id="control-s0-1", split="validation")[-1]
        preds = ledger.predictions(tests[0].id)
    assert [(x.look_number, x.run_id) for x in looks] == [(1, "control-s0-1")]
    assert looks[0].config["split"] == "test"
    assert looks[0].config["checkpoint"].endswith("step-000012")
    assert [(e.run_id, e.test_look, e.update) for e in tests] == [("control-s0-1", 1, 12)]
    assert (
        tests[0].eval_config_hash == looks[0].config["eval_config_hash"] == out["eval_config_hash"]
    )
    assert tests[0].eval_config_hash != validation.eval_config_hash  # other examples
    assert {p.example_id for p in preds} == sealed_ids(trained) and len(preds) == 18
    assert set(tests[0].metrics["per_class"]) == {"refund", "delivery", "cancel"}


def test_h4_second_look_by_any_run_warns_loudly_and_both_are_counted(trained: Path, capsys):
    ws = Workspace.open(trained)
    assert final_test(ws, "control-s0-1", as_json=False) == 0
    assert "the test split has been looked at" not in capsys.readouterr().err
    assert final_test(ws, BASELINE, as_json=True) == 0  # another "run": still a second look
    captured = capsys.readouterr()
    warning = "the test split has been looked at 2 times; each look used to choose erodes its"
    assert warning + " value (H4)" in flat(captured.err)
    assert "look 1: control-s0-1" in flat(captured.err)
    assert json.loads(captured.out)["warning"].startswith(warning)
    with Ledger.open(ws.ledger_path) as ledger:
        assert [x.run_id for x in ledger.test_looks()] == ["control-s0-1", BASELINE]
        assert [e.test_look for e in ledger.evaluations(split="test")] == [1, 2]


def test_h4_refuse_policy_refuses_a_second_look_and_records_nothing(trained: Path, capsys):
    ws = Workspace.open(trained, ["test_policy.on_second_look=refuse"])
    assert final_test(ws, "control-s0-1", as_json=False) == 0  # the first look is allowed
    capsys.readouterr()
    assert final_test(ws, "control-s0-1", as_json=True) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["refused"] is True
    assert "test_policy.on_second_look is `refuse`" in flat(captured.err)
    with Ledger.open(ws.ledger_path) as ledger:
        assert len(ledger.test_looks()) == 1
        assert len(ledger.evaluations(split="test")) == 1


def test_h4_only_a_completed_run_is_tested_and_a_refusal_counts_no_look(trained: Path):
    ws = Workspace.open(trained)
    with pytest.raises(InputError, match="status diverged"):
        final_test(ws, "lr-huge-s0-1", as_json=False)
    with pytest.raises(InputError, match="no such run"):
        final_test(ws, "control-s9-1", as_json=False)
    with Ledger.open(ws.ledger_path) as ledger:
        assert ledger.test_looks() == []
