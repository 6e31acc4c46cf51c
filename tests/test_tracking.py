"""Trackers (`tracking: [tensorboard, mlflow]`): a run's curve and evaluation points reach
TensorBoard's event file and a local MLflow store equal to the ledger's, with the run's
identity as params and tags; a tracker that fails never fails the run (V5, the ledger stays
the source of truth)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunepilot.data.workspace import Workspace
from tunepilot.demo.campaign import write_demo_campaign
from tunepilot.experiments import flow as run_flow
from tunepilot.ledger import Ledger

SHORT = {
    "training.budget.updates": 4,
    "training.eval_every": 2,
    "training.microbatch": 2,
    "training.accumulation": 2,
    "seeds": [0],
}


def _campaign(folder: Path, tracking: list[str]) -> Path:
    return write_demo_campaign(
        folder, tiny=True, n_conversations=30, overrides={**SHORT, "tracking": tracking}
    )


def _tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    return {
        tag: {e.step: tensor_util.make_ndarray(e.tensor_proto).item() for e in events.Tensors(tag)}
        for tag in events.Tags()["tensors"]
    }


def _mlflow_run(store: Path, run_id: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    (run,) = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        f"tags.`tunepilot.run_id` = '{run_id}'",
    )
    return client, run


def test_v5_both_trackers_receive_the_ledgers_curve_and_evaluations(tmp_path: Path):
    ws = Workspace.open(_campaign(tmp_path, ["tensorboard", "mlflow"]))
    assert run_flow.run(ws, ["control"], "0", None, as_json=True) == 0
    with Ledger.open(ws.ledger_path) as ledger:
        (row,) = ledger.list_runs()
        curve = {p.update: (p.loss, p.lr) for p in ledger.curve(row.id)}
    records = [json.loads(x) for x in (ws.runs_dir / row.id / "metrics.jsonl").open()]
    evals = [json.loads(x) for x in (ws.runs_dir / row.id / "evals.jsonl").open()]
    assert len(curve) == 4 and [e["update"] for e in evals] == [2, 4]

    board = _tensorboard_scalars(ws.root / "tracking" / "tensorboard" / row.id)
    assert board["train/loss"] == {u: loss for u, (loss, _) in curve.items()}
    assert board["train/lr"] == {u: lr for u, (_, lr) in curve.items()}
    assert board["train/grad_norm"] == {r["update"]: r["grad_norm"] for r in records}
    assert set(board["train/examples_per_second"]) == set(curve)
    assert board["eval/accuracy"] == {e["update"]: e["eval"]["accuracy"] for e in evals}

    client, run = _mlflow_run(ws.root / "tracking" / "mlflow.db", row.id)
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/loss")}
    assert history == {u: loss for u, (loss, _) in curve.items()}
    acc = client.get_metric_history(run.info.run_id, "eval/accuracy")
    assert {m.step: m.value for m in acc} == {e["update"]: e["eval"]["accuracy"] for e in evals}
    assert run.data.params["variant"] == "control" and run.data.params["seed"] == "0"
    assert run.data.params["data_version"] == row.data_version
    assert run.data.params["config_hash"] == row.config_hash
    assert "None" not in run.data.params.values()  # an unset revision is left out, not "None"
    assert run.data.tags["hypothesis"] == ws.campaign.hypothesis.behaviour
    assert run.info.status == "FINISHED"


def test_v5_a_failing_tracker_warns_once_and_the_run_completes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    campaign = _campaign(tmp_path, ["tensorboard"])
    (tmp_path / "tracking").write_text("a file where the tracker wants its folder")
    ws = Workspace.open(campaign)
    assert run_flow.run(ws, ["control"], "0", None, as_json=True) == 0
    out, err = capsys.readouterr()
    json.loads(out)  # --json: stdout is one document
    assert err.count("tracker tensorboard stopped") == 1
    with Ledger.open(ws.ledger_path) as ledger:
        (row,) = ledger.list_runs()
        assert row.status == "completed" and len(ledger.curve(row.id)) == 4


def test_v2_tracking_leaves_the_config_hash_unchanged(tmp_path: Path):
    plain = Workspace.open(_campaign(tmp_path / "a", []))
    tracked = Workspace.open(_campaign(tmp_path / "b", ["mlflow"]))
    assert tracked.campaign.tracking == ["mlflow"]
    assert plain.campaign.config_hash() == tracked.campaign.config_hash()
