"""Trackers (`tracking: [tensorboard, mlflow, wandb]`): a run's curve and evaluation points
reach TensorBoard's dashboard, a local MLflow store and an offline W&B run equal to the
ledger's (TensorBoard as float32, the one scalar type its default loader serves), with the
run's identity as params and tags; a tracker that fails never fails the run (V5, the ledger
stays the source of truth). Each is read back through the tracker's own reader: TensorBoard's
HTTP data API on its default fast loader, MLflow's client, `wandb leet inspect`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
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


def _f32(value: float) -> float:
    """What TensorBoard holds for a number: its float32 rounding."""
    return float(np.float32(value))


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
    assert board["train/loss"] == {u: _f32(loss) for u, (loss, _) in curve.items()}
    assert board["train/lr"] == {u: _f32(lr) for u, (_, lr) in curve.items()}
    assert board["train/grad_norm"] == {r["update"]: _f32(r["grad_norm"]) for r in records}
    assert set(board["train/examples_per_second"]) == set(curve)
    assert board["eval/accuracy"] == {e["update"]: _f32(e["eval"]["accuracy"]) for e in evals}

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


def _dashboard_scalars(logdir: Path) -> dict[str, dict[str, dict[int, float]]]:
    """{run: {tag: {step: value}}} as TensorBoard's default dashboard fetches them: a real
    `tensorboard` server on 127.0.0.1 with `--load_fast=true` (its Rust data server, the
    loader `tensorboard --logdir DIR` picks), read over the scalars plugin's HTTP routes."""
    from tensorboard import program

    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", str(logdir), "--load_fast", "true",
                          "--host", "127.0.0.1", "--port", "0"])  # fmt: skip
    url = board.launch()
    deadline = time.monotonic() + 20
    tags: dict = {}
    while time.monotonic() < deadline:  # the data server loads in the background
        tags = json.load(urllib.request.urlopen(f"{url}data/plugin/scalars/tags", timeout=5))
        if tags and all(len(t) >= 5 for t in tags.values()):
            break
        time.sleep(0.25)
    out: dict[str, dict[str, dict[int, float]]] = {}
    for run, run_tags in tags.items():
        for tag in run_tags:
            query = urllib.parse.urlencode({"run": run, "tag": tag})
            rows = json.load(urllib.request.urlopen(
                f"{url}data/plugin/scalars/scalars?{query}", timeout=5))  # fmt: skip
            out.setdefault(run, {})[tag] = {step: value for _, step, value in rows}
    return out


@pytest.fixture(scope="module")
def all_trackers(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """One run copied to all three trackers, W&B offline (no key in the environment)."""
    saved = {k: os.environ.pop(k) for k in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT",
                                            "WANDB_DIR") if k in os.environ}  # fmt: skip
    try:
        folder = tmp_path_factory.mktemp("trackers")
        ws = Workspace.open(_campaign(folder, ["tensorboard", "mlflow", "wandb"]))
        assert run_flow.run(ws, ["control"], "0", None, as_json=True) == 0
    finally:
        os.environ.update(saved)
    return ws


def test_v5_tensorboards_default_dashboard_shows_every_scalar_of_the_ledger(
    all_trackers: Workspace,
):
    ws = all_trackers
    with Ledger.open(ws.ledger_path) as ledger:
        (row,) = ledger.list_runs()
        curve = {p.update: (p.loss, p.lr) for p in ledger.curve(row.id)}
    evals = [json.loads(x) for x in (ws.runs_dir / row.id / "evals.jsonl").open()]
    shown = _dashboard_scalars(ws.root / "tracking" / "tensorboard")[row.id]
    assert shown["train/loss"] == {u: _f32(loss) for u, (loss, _) in curve.items()}
    assert shown["train/lr"] == {u: _f32(lr) for u, (_, lr) in curve.items()}
    assert shown["eval/accuracy"] == {e["update"]: _f32(e["eval"]["accuracy"]) for e in evals}
    assert {"train/grad_norm", "train/examples_per_second", "eval/loss"} <= set(shown)


def _wandb_records(run_dir: Path) -> tuple[list[dict], dict]:
    """The offline run's records and its summary through W&B's own reader of a .wandb log
    (`wandb leet inspect`, the library's wandb-core)."""
    wandb_cli = [sys.executable, "-c", "from wandb.cli.cli import cli; cli()", "leet", "inspect"]
    records = subprocess.run([*wandb_cli, str(run_dir), "--json"], capture_output=True,
                             text=True, timeout=120, check=True).stdout  # fmt: skip
    summary = subprocess.run([*wandb_cli, str(run_dir), "--summary", "--json"],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    return [json.loads(line) for line in records.splitlines() if line.strip()], json.loads(summary)


def test_v5_wandb_offline_run_holds_the_ledgers_curve_evaluations_and_identity(
    all_trackers: Workspace,
):
    ws = all_trackers  # no WANDB_API_KEY: offline, written under tracking/wandb/
    with Ledger.open(ws.ledger_path) as ledger:
        (row,) = ledger.list_runs()
        curve = {p.update: (p.loss, p.lr) for p in ledger.curve(row.id)}
    evals = [json.loads(x) for x in (ws.runs_dir / row.id / "evals.jsonl").open()]
    (run_dir,) = (ws.root / "tracking" / "wandb").glob(f"offline-run-*-{row.id}-*")
    records, summary = _wandb_records(run_dir)
    history = {r["history"]["step"]["num"]: r["history"]["item"]
               for r in records if r["type"] == "history"}  # fmt: skip
    assert {u: h["train/loss"] for u, h in history.items()} == {
        u: loss for u, (loss, _) in curve.items()}  # fmt: skip
    assert {u: h["train/lr"] for u, h in history.items()} == {
        u: lr for u, (_, lr) in curve.items()}  # fmt: skip
    assert {u: h["eval/accuracy"] for u, h in history.items() if "eval/accuracy" in h} == {
        e["update"]: e["eval"]["accuracy"] for e in evals}  # fmt: skip
    assert summary["name"] == row.id and summary["state"] == "finished"
    assert summary["project"] == ws.campaign.name and summary["exit_code"] == 0
    assert summary["summary"]["tunepilot.status"] == "completed"
    client, mlflow_run = _mlflow_run(ws.root / "tracking" / "mlflow.db", row.id)
    config = {k: v for k, v in summary["config"].items() if k not in ("tags", "_wandb")}
    assert {k: str(v) for k, v in config.items()} == mlflow_run.data.params  # same params
    tags = {k: v for k, v in mlflow_run.data.tags.items() if not k.startswith("mlflow.")}
    assert summary["config"]["tags"] == {k: v for k, v in tags.items()
                                         if k != "tunepilot.status"}  # fmt: skip
    assert summary["notes"] == ws.campaign.hypothesis.behaviour


def test_v5_a_failing_wandb_tracker_warns_once_and_the_run_completes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    campaign = _campaign(tmp_path, ["wandb"])
    (tmp_path / "tracking").write_text("a file where the tracker wants its folder")
    ws = Workspace.open(campaign)
    start = time.monotonic()
    assert run_flow.run(ws, ["control"], "0", None, as_json=True) == 0
    assert time.monotonic() - start < 60  # no wait on a tracker that cannot start
    out, err = capsys.readouterr()
    json.loads(out)
    assert err.count("tracker wandb stopped") == 1
    with Ledger.open(ws.ledger_path) as ledger:
        (row,) = ledger.list_runs()
        assert row.status == "completed" and len(ledger.curve(row.id)) == 4
    assert os.environ.get("WANDB_MODE") is None  # the sink never sets the user's environment
