"""Recovery across processes: SIGTERM mid-run, a file-size limit, a read-only campaign folder
(R1, V3). Real `tunepilot` processes on a tiny campaign made from the shipped template; the
limit is a real `resource.setrlimit(RLIMIT_FSIZE)`, with SIGXFSZ ignored so that a write past
it fails with EFBIG instead of killing the process, as a full disk fails it with ENOSPC. The
training ones are in the slow tier; test_recovery.py holds the limit at export and ledger.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunepilot.data.workspace import Workspace
from tunepilot.demo.campaign import write_demo_campaign
from tunepilot.experiments import flow as run_flow
from tunepilot.ledger import Ledger
from tunepilot.train.checkpoint import step_folders

LIMIT = 400_000
"""Above the ledger and the run's small files, below a full fine-tune's weights (~0.5 MB)."""


def tunepilot(*args: str, limit: int | None = None, **kw) -> subprocess.Popen[str]:
    def limited() -> None:
        if limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.Popen(
        [sys.executable, "-m", "tunepilot.cli", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=limited, **kw,
    )  # fmt: skip


def campaign_at(folder: Path, **overrides: object) -> Path:
    short = {"training.budget.updates": 6, "training.accumulation": 2,
             "training.eval_every": 3} | overrides  # fmt: skip
    return write_demo_campaign(folder, tiny=True, n_conversations=40, overrides=short)


def curve(campaign: Path, run_id: str) -> list[float]:
    with Ledger.open(campaign.parent) as ledger:
        return [p.loss for p in ledger.curve(run_id)]


@pytest.mark.slow
def test_r1_v3_sigterm_saves_a_checkpoint_records_the_signal_and_resumes_bit_identically(
    tmp_path: Path,
) -> None:
    campaign = campaign_at(tmp_path / "c", **{"training.budget.updates": 40})
    metrics = tmp_path / "c" / "runs" / "control-s0-1" / "metrics.jsonl"
    proc = tunepilot("run", str(campaign), "--variant", "control")
    deadline = time.monotonic() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # what a preempted spot instance receives
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "stopped by SIGTERM" in err

    stopped_at = len(metrics.read_text().splitlines())
    assert 3 <= stopped_at < 40
    with Ledger.open(campaign.parent) as ledger:
        row = ledger.get_run("control-s0-1")
    assert row.status == "interrupted" and "stopped by SIGTERM" in row.reason
    assert f"step-{stopped_at:06d} saved" in row.reason and "tunepilot resume" in row.reason
    assert step_folders(metrics.parent)[0].name == f"step-{stopped_at:06d}"

    ws = Workspace.open(campaign)
    assert run_flow.resume(ws, "control-s0-1", None, as_json=True) == 0
    run_flow.run(ws, ["control"], "0", None, as_json=True)  # the uninterrupted reference
    assert curve(campaign, "control-s0-1") == curve(campaign, "control-s0-2")


@pytest.mark.slow
def test_r1_v3_a_file_size_limit_during_a_checkpoint_exits_2_naming_the_path_and_the_size(
    tmp_path: Path,
) -> None:
    campaign = campaign_at(tmp_path / "c", **{"model.method": "full"})
    proc = tunepilot("run", str(campaign), "--variant", "control", limit=LIMIT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err
    assert "Traceback" not in err and "Error while serializing" in err
    flat = " ".join(err.split())
    assert ".tmp-step-000001" in flat and "needs about" in flat and "ulimit -f" in flat
    checkpoints = tmp_path / "c" / "runs" / "control-s0-1" / "checkpoints"
    assert not [p for p in checkpoints.iterdir() if p.name.startswith(".tmp")]

    db = sqlite3.connect(tmp_path / "c" / "tunepilot.db")
    orphans = db.execute("SELECT id FROM run_ids WHERE id NOT IN (SELECT id FROM runs)")
    assert orphans.fetchall() == []  # every reserved id has its runs row
    db.close()
    with Ledger.open(campaign.parent) as ledger:
        row = ledger.get_run("control-s0-1")
    assert row.status == "interrupted" and "--retry control-s0-1" in row.reason


def test_storage_a_file_size_limit_at_any_write_is_a_sentence_naming_the_file_exit_2(
    tmp_path: Path,
) -> None:
    """Not only checkpoints, exports and the ledger: the split files an audit writes and the
    campaign file `init` writes hit the same limit. Each is exit 2 naming the file, never the
    last-resort exit 3, and leaves neither half a file nor a temporary behind."""
    import json

    proc = tunepilot("init", str(tmp_path / "new"), "--task", "classification", limit=1000)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert "campaign.yaml" in err and "ulimit -f" in err and "Traceback" not in err
    assert list((tmp_path / "new").iterdir()) == []  # no empty campaign.yaml blocks a retry

    campaign = campaign_at(tmp_path / "c")
    proc = tunepilot("data", "audit", str(campaign), "--json", limit=2000)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    (problem,) = json.loads(out)["problems"]
    assert problem["where"].endswith("splits.json") and "file-size limit" in problem["found"]
    written = [p.name for p in (tmp_path / "c" / "data").rglob("*") if p.is_file()]
    assert not [n for n in written if n.endswith(".tmp") or n == "splits.json"], written


def test_l4_a_read_only_campaign_folder_says_so_and_never_advises_moving_the_ledger(
    tmp_path: Path,
) -> None:
    campaign = campaign_at(tmp_path / "c")
    Ledger.open(campaign.parent).close()
    cmd = [sys.executable, "-m", "tunepilot.cli", "runs", str(campaign)]
    if os.geteuid() != 0:
        os.chmod(campaign.parent, 0o555)
    elif shutil.which("unshare") and subprocess.run(["unshare", "-rm", "true"]).returncode == 0:
        ro = f"mount --bind {campaign.parent} {campaign.parent} && " \
             f"mount -o remount,ro,bind {campaign.parent}"  # fmt: skip
        cmd = ["unshare", "-rm", "sh", "-c", f"{ro} && exec \"$0\" \"$@\"", *cmd]
    else:
        pytest.skip("running as root without user namespaces: no way to make a folder read-only")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    finally:
        os.chmod(campaign.parent, 0o755)
    flat = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stderr
    assert "read-only" in flat and "cp -a" in flat and "chmod" in flat
    assert "move it away" not in flat and "Traceback" not in flat
