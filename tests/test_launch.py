"""`tunepilot plan --emit skypilot` (L3, B1, R1): a SkyPilot task file whose resources are the
planned card, whose setup installs tunepilot, whose run goes through the package's phases in
order with the campaign folder on a bucket, and which SkyPilot's own loader accepts (its
`sky.Task.from_yaml` where SkyPilot is installed, its published schemas otherwise). A
launched job repeats safely after a preemption: each run is new, resumed or done by the
ledger. The multi-node launch is a real torchrun c10d rendezvous of two "nodes" on 127.0.0.1
whose losses equal one machine with two processes."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tunepilot.data.workspace import Workspace
from tunepilot.demo.campaign import write_demo_campaign

SCHEMAS = Path(__file__).parent / "data" / "skypilot_schemas.json"
SHORT = {"training.budget.updates": 3, "training.eval_every": 3, "training.microbatch": 2,
         "training.accumulation": 2, "seeds": [0, 1]}  # fmt: skip


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_campaign(tmp_path_factory.mktemp("launch"), tiny=True, n_conversations=30,
                               overrides=SHORT)  # fmt: skip


def _emit(campaign: Path, card: str = "8x H100 80GB", nodes: int = 1) -> dict:
    from tunepilot.sizing.launch import emit_skypilot

    ws = Workspace.open(campaign)
    path = emit_skypilot(ws, {"target": card, "sentence": "the 3-day package fits"}, None, nodes)
    assert path == ws.root / "launch" / "skypilot.yaml"
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_l3_emitted_task_names_the_card_installs_tunepilot_and_runs_the_phases_in_order(
    campaign: Path,
):
    task = _emit(campaign)
    assert task["resources"]["accelerators"] == "H100:8" and task["num_nodes"] == 1
    mount = task["file_mounts"]["/campaign"]
    assert mount["source"] == str(campaign.parent.resolve()) and mount["mode"] == "MOUNT_CACHED"
    assert "make .venv/.installed TORCH=torch" in task["setup"]  # the README's GPU install
    assert task["file_mounts"]["~/tunepilot-src"] == str(Path(__file__).resolve().parents[1])
    run = task["run"]
    order = [run.index(f"phase {i} ") for i in (1, 2, 4, 5, 6, 7)]
    assert order == sorted(order)
    repilot = "phase 1 're-pilot on this card' tunepilot pilot \"$CAMPAIGN\" --gpu '8x H100 80GB'"
    assert repilot in run
    runs = [line for line in run.splitlines() if "launch_step run" in line]
    assert [line.split()[-2:] for line in runs] == [
        ["control", "0"], ["control", "1"], ["lr-5e-5", "0"], ["lr-5e-5", "1"],
        ["lr-2e-4", "0"], ["lr-2e-4", "1"]]  # fmt: skip
    assert run.index("phase 2 ") < run.index(runs[0]) < run.index("phase 4 ")
    assert "TUNEPILOT_NPROC=8 TUNEPILOT_NNODES=1" in run
    subprocess.run(["bash", "-n"], input=run, text=True, check=True)  # the script parses


def test_l3_emitted_task_passes_skypilots_published_schemas(campaign: Path):
    import jsonschema

    schemas = json.loads(SCHEMAS.read_text(encoding="utf-8"))
    for nodes in (1, 2):
        task = _emit(campaign, "A100 80GB", nodes)
        jsonschema.validate(task, schemas["task"])
        jsonschema.validate(task["resources"], schemas["resources"])
        jsonschema.validate(task["file_mounts"]["/campaign"], schemas["storage"])
    broken = dict(task, num_nodes="two")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schemas["task"])


def test_l3_emitted_task_loads_with_skypilots_own_loader(campaign: Path):
    sky = pytest.importorskip("sky", reason="SkyPilot not installed (pip install -e '.[launch]')")
    from tunepilot.sizing.launch import emit_skypilot

    ws = Workspace.open(campaign)
    path = emit_skypilot(ws, {"target": "8x H100 80GB"}, None, 2)
    task = sky.Task.from_yaml(str(path))
    assert task.num_nodes == 2
    (resources,) = task.resources
    assert resources.accelerators == {"H100": 8}
    assert "/campaign" in task.storage_mounts
    assert "launch_step run" in task.run


def test_l3_two_node_task_lets_the_other_nodes_join_every_run(campaign: Path):
    run = _emit(campaign, "H100 80GB", nodes=2)["run"]
    join = run[run.index('if [ "$SKYPILOT_NODE_RANK" != 0 ]'):run.index("\nfi\n")]
    assert join.count("launch_step run") == 6 and "exit 0" in join
    from tunepilot.sizing.launch import rendezvous_flags

    assert rendezvous_flags(2, "10.0.0.1", "job-control-s0") == [
        "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500",
        "--rdzv-id=job-control-s0"]  # fmt: skip


def test_l3_emit_refuses_an_unknown_launcher_with_exit_2(campaign: Path):
    done = subprocess.run([sys.executable, "-m", "tunepilot.cli", "plan", str(campaign),
                           "--emit", "dstack"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--emit skypilot" in done.stderr


def test_r1_launch_step_runs_resumes_or_skips_from_the_ledger(campaign: Path, monkeypatch):
    from tunepilot.ledger import Ledger
    from tunepilot.sizing.launch_step import node_command, run_action

    folder = campaign.parent.parent / "launch-step"
    shutil.copytree(campaign.parent, folder, dirs_exist_ok=True)
    path = folder / "campaign.yaml"
    for name in ("TUNEPILOT_NPROC", "TUNEPILOT_NNODES", "SKYPILOT_NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert run_action(path, "control", 0) == ("new", None)
    assert node_command(path, "control", 0)[-5:] == ["run", str(path), "--variant", "control",
                                                     "--seeds", "0"][-5:]  # fmt: skip
    from tunepilot.experiments import flow as run_flow

    ws = Workspace.open(path)
    assert run_flow.run(ws, ["control"], "0", 1, as_json=True) == 0  # paused after 1 update
    with Ledger.open(ws.ledger_path) as ledger:
        (row,) = ledger.list_runs()
    assert row.status == "interrupted"
    assert run_action(path, "control", 0) == ("resume", row.id)
    assert node_command(path, "control", 0)[3:6] == ["resume", row.id, str(path)]
    assert run_flow.resume(ws, row.id, None, as_json=True) == 0
    assert run_action(path, "control", 0) == ("done", row.id)
    assert node_command(path, "control", 0) is None
    monkeypatch.setenv("TUNEPILOT_NPROC", "4")
    monkeypatch.setenv("TUNEPILOT_NNODES", "2")
    monkeypatch.setenv("TUNEPILOT_HEAD", "10.0.0.1")
    monkeypatch.setenv("SKYPILOT_NODE_RANK", "1")
    worker = node_command(path, "control", 1)
    assert "tunepilot.experiments.worker" in worker and "--standalone" not in worker
    assert "--rdzv-endpoint=10.0.0.1:29500" in worker and "--resume" not in worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _curve(run_dir: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").open()]


@pytest.mark.slow
def test_b3_two_nodes_joined_by_c10d_on_127_0_0_1_train_the_two_process_curve(tmp_path: Path):
    """Two "nodes" x 1 process, each started by the launched job's own step with the
    emitted rendezvous flags (c10d at 127.0.0.1), against one node x 2 processes."""
    from tunepilot.experiments.jobs import run_distributed
    from tunepilot.ledger import Ledger

    overrides = {**SHORT, "seeds": [0], "training.budget.updates": 4}
    one = write_demo_campaign(tmp_path / "one", tiny=True, n_conversations=30, overrides=overrides)
    two = write_demo_campaign(tmp_path / "two", tiny=True, n_conversations=30, overrides=overrides)
    assert run_distributed(Workspace.open(one), "control", 0, 2, "ddp") == 0
    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "TUNEPILOT_NPROC": "1", "TUNEPILOT_NNODES": "2",
               "TUNEPILOT_HEAD": "127.0.0.1", "TUNEPILOT_RDZV_PORT": str(port),
               "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_TASK_ID": "test",
               "OMP_NUM_THREADS": "1"}  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tunepilot.sizing.launch_step", "run", str(two), "control",
             "0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert "--rdzv-backend=c10d" in outputs[0] and "tunepilot.experiments.worker" in outputs[1]
    with Ledger.open(Workspace.open(two).ledger_path) as ledger:
        (row,) = ledger.list_runs()
        assert row.status == "completed" and row.budget["world_size"] == 2
        assert row.id == "control-s0-1"  # the id node 0 reserved, wherever rank 0 ran
    reference = _curve(Workspace.open(one).runs_dir / "control-s0-1")
    assert _curve(Workspace.open(two).runs_dir / row.id) == reference
