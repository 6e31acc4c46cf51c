"""What people read (V3, V6): `runs` shows each run's headline metric on validation, and
`compare` never prints a mean over two seeds beside a delta paired on one without saying
which seeds each figure covers."""

from __future__ import annotations

import json

import pytest

from tunepilot.data.workspace import Workspace
from tunepilot.demo.campaign import write_demo_campaign
from tunepilot.experiments import flow as run_flow

SHORT = {"training.budget.updates": 2, "training.eval_every": 2, "training.microbatch": 2,
         "training.accumulation": 2, "seeds": [0, 1],
         "variants": {"lr-5e-5": {"explain": "Half.", "overrides": {"training.lr": 5e-5}}}}


@pytest.fixture(scope="module")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """The control on seeds 0 and 1, the variant on seed 0 only."""
    folder = tmp_path_factory.mktemp("uneven")
    ws = Workspace.open(write_demo_campaign(folder, tiny=True, n_conversations=30,
                                            overrides=SHORT))  # fmt: skip
    assert run_flow.run(ws, ["control"], "0,1", None, as_json=True) == 0
    assert run_flow.run(ws, ["lr-5e-5"], "0", None, as_json=True) == 0
    return ws


def test_v3_runs_lists_each_runs_headline_metric_on_validation(uneven: Workspace, capsys):
    from tunepilot.ledger import Ledger

    capsys.readouterr()
    assert run_flow.list_runs(uneven, as_json=True) == 0
    listed = json.loads(capsys.readouterr().out)
    with Ledger.open(uneven.ledger_path) as ledger:
        expected = {r.id: ledger.evaluations(run_id=r.id, split="validation")[-1].metrics
                    for r in ledger.list_runs()}  # fmt: skip
    assert {x["id"]: x["validation"] for x in listed} == {
        k: m["macro_f1"] for k, m in expected.items()}  # fmt: skip
    assert {x["metric"] for x in listed} == {"macro_f1"}
    assert run_flow.list_runs(uneven, as_json=False) == 0
    table = capsys.readouterr().out
    assert "macro_f1 (validation)" in table
    assert f"{expected['control-s0-1']['macro_f1']:.4f}" in table


def test_v6_compare_says_the_delta_is_paired_on_one_seed_beside_two_seed_means(
    uneven: Workspace, capsys
):
    from tunepilot.experiments.compare import compare_command

    capsys.readouterr()
    compare_command(uneven, as_json=False)
    out = " ".join(capsys.readouterr().out.split())
    assert "seed 0" in out and "Δ paired, on the seeds both ran" in out
    assert ("lr-5e-5: the means cover seeds 0, 1 (control seeds 0, 1); its Δ is paired on "
            "seed 0 only") in out


@pytest.mark.slow  # a subprocess dry run: ~10 s on a quiet machine
def test_s1_size_says_what_it_is_doing_on_stderr_and_keeps_json_on_stdout(tmp_path):
    import subprocess
    import sys

    path = write_demo_campaign(tmp_path, tiny=True, n_conversations=30)
    done = subprocess.run([sys.executable, "-m", "tunepilot.cli", "size", str(path), "--json"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)
    lines = done.stderr.splitlines()
    assert any("size: dry run of base-model" in line for line in lines)
    assert any("dry run: microbatch 2 x" in line and "started" in line for line in lines)
    assert any("dry run: microbatch 2 x" in line and "done, 2/2 models" in line for line in lines)
