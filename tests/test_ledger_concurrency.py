"""The ledger with real processes (V3): several writers at once lose nothing, and a run whose
process is killed is found and marked interrupted by the next command that opens the ledger.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunepilot.ledger import DB_NAME, Ledger

SRC = str(Path(__file__).resolve().parents[1] / "src")

# Each writer waits for the go file, then, per iteration: registers a run on the shared
# prefix "v-s0-*", moves it through running -> completed, writes a note about it and
# reserves an id on a second shared prefix. It prints every id it got.
# (Without a pause between iterations, SQLite's sleeping busy handler lets one writer win the
# lock many times in a row; nothing is lost, but the writes would barely overlap.)
WRITER = r"""
import os, sys, time
from pathlib import Path
from tunepilot.ledger import Ledger
folder, name, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with Ledger.open(folder) as led:
    while not (folder / "go").exists():
        time.sleep(0.002)
    for i in range(n):
        rid = led.register_run(campaign="c", variant="v", seed=0, config_hash="h",
                               data_version="d")
        led.set_status(rid, "running")
        led.heartbeat(rid)
        led.set_status(rid, "completed", f"{name} iteration {i}")
        led.add_note(f"{name} {i}", run_id=rid)
        print("run", rid, flush=True)
        print("reserved", led.new_run_id("shared", 1), flush=True)
        time.sleep(0.001)  # a real writer works between writes; the others get the lock
"""

# Registers itself as running, says so, then sleeps until it is killed.
SLEEPER = r"""
import sys, time
from tunepilot.ledger import Ledger
with Ledger.open(sys.argv[1]) as led:
    rid = led.register_run(campaign="c", variant="victim", seed=0, config_hash="h",
                           data_version="d", status="running")
    led.heartbeat(rid)
    print(rid, flush=True)
    time.sleep(60)
"""

# Holds the write lock for a while, as a long transaction of another process would.
HOLDER = r"""
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN IMMEDIATE")
print("holding", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("COMMIT")
"""


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_v3_four_processes_writing_at_once_lose_nothing_and_never_share_an_id(tmp_path: Path):
    workers, per_worker = 4, 70  # 210 status rows per writer
    Ledger.open(tmp_path).close()  # created once; the writers race on everything else
    procs = [_python(WRITER, str(tmp_path), f"w{k}", str(per_worker)) for k in range(workers)]
    time.sleep(0.3)  # let them start and block on the go file, so their writes overlap
    (tmp_path / "go").touch()
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert "locked" not in err and "busy" not in err
    lines = [[line.split() for line in out.splitlines()] for out, _ in outputs]
    got_runs = [w[1] for mine in lines for w in mine if w[0] == "run"]
    reserved = [w[1] for mine in lines for w in mine if w[0] == "reserved"]
    total = workers * per_worker
    assert len(got_runs) == total and len(set(got_runs)) == total
    assert sorted(got_runs) == sorted(f"v-s0-{n}" for n in range(1, total + 1))
    assert sorted(reserved) == sorted(f"shared-s1-{n}" for n in range(1, total + 1))
    # the writes really overlapped: run after run, the writers took turns with the lock
    numbers = [[int(w[1].rsplit("-", 1)[1]) for w in mine if w[0] == "run"] for mine in lines]
    assert any(nums != list(range(nums[0], nums[0] + per_worker)) for nums in numbers)

    with Ledger.open(tmp_path) as led:
        runs = led.list_runs()
        assert len(runs) == total and all(r.status == "completed" for r in runs)
        con = sqlite3.connect(tmp_path / DB_NAME)
        status_rows = con.execute("SELECT count(*) FROM run_status").fetchone()[0]
        assert status_rows == 3 * total  # planned, running, completed for every run
        bad = con.execute(
            """SELECT run_id, group_concat(status, ',') FROM (
                 SELECT run_id, status FROM run_status ORDER BY id)
               GROUP BY run_id HAVING group_concat(status, ',') <> 'planned,running,completed'"""
        ).fetchall()
        con.close()
        assert bad == []
        notes = led.notes()
        assert len(notes) == total
        for k in range(workers):  # each writer's notes are all there, in its own order
            mine = [n.text for n in notes if n.text.startswith(f"w{k} ")]
            assert mine == [f"w{k} {i}" for i in range(per_worker)]


def test_v3_a_writer_that_outwaits_the_busy_timeout_retries_instead_of_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import tunepilot.ledger.store as ledger_module

    monkeypatch.setattr(ledger_module, "BUSY_TIMEOUT_S", 0.02)  # SQLite gives up fast ...
    with Ledger.open(tmp_path) as led:
        holder = _python(HOLDER, str(tmp_path / DB_NAME), "0.6")
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        started = time.monotonic()
        note = led.add_note("written once the other process lets go")  # ... we retry
        waited = time.monotonic() - started
    holder.communicate(timeout=10)
    assert holder.returncode == 0
    assert waited > 0.3  # it really waited for the lock, and then it wrote
    with Ledger.open(tmp_path) as led:
        assert [(n.id, n.text) for n in led.notes()] == [
            (note, "written once the other process lets go")
        ]


def test_v3_a_killed_run_is_marked_interrupted_with_its_pid_by_the_next_open(tmp_path: Path):
    proc = _python(SLEEPER, str(tmp_path))
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    assert run_id == "victim-s0-1", proc.stderr.read() if proc.stderr else ""
    with Ledger.open(tmp_path) as led:  # alive: a live process is never declared dead
        assert led.interrupted_on_open == [] and led.current_status(run_id).status == "running"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    proc.communicate()

    with Ledger.open(tmp_path) as led:
        (dead,) = led.interrupted_on_open
        assert dead.run_id == run_id and dead.pid == proc.pid
        current = led.current_status(run_id)
        assert current.status == "interrupted"
        assert f"process {proc.pid}" in current.reason and "is gone" in current.reason
        assert "last heartbeat at" in current.reason
        assert [h.status for h in led.status_history(run_id)] == ["running", "interrupted"]
    with Ledger.open(tmp_path) as led:  # marked once, not again on every open
        assert led.interrupted_on_open == []
        assert len(led.status_history(run_id)) == 2


def test_v3_an_unreaped_killed_process_counts_as_dead(tmp_path: Path):
    pytest.importorskip("psutil")
    proc = _python(SLEEPER, str(tmp_path))
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    os.kill(proc.pid, signal.SIGKILL)
    time.sleep(0.2)  # not reaped yet: a zombie still answers os.kill(pid, 0)
    try:
        with Ledger.open(tmp_path, mark_dead=False) as led:
            (dead,) = led.find_dead_runs()
            assert dead.run_id == run_id and ("zombie" in dead.reason or "gone" in dead.reason)
    finally:
        proc.wait(timeout=10)
        proc.communicate()


def test_v3_a_reused_pid_and_a_silent_other_host_both_mean_interrupted(tmp_path: Path):
    pytest.importorskip("psutil")
    with Ledger.open(tmp_path) as led:
        reused = led.register_run(
            campaign="c", variant="a", seed=0, config_hash="h", data_version="d", status="running"
        )
        remote = led.register_run(
            campaign="c", variant="b", seed=0, config_hash="h", data_version="d", status="running"
        )
        assert led.find_dead_runs() == []  # both point at this live test process
        con = sqlite3.connect(tmp_path / DB_NAME)
        # what another writer would have left: the pid started at another time, and a
        # heartbeat written by a machine whose pids mean nothing here
        con.execute("UPDATE heartbeats SET proc_start = 1.0 WHERE run_id = ?", (reused,))
        con.execute("UPDATE heartbeats SET host = 'gpu-node-7' WHERE run_id = ?", (remote,))
        con.commit()
        con.close()
        assert [d.run_id for d in led.find_dead_runs()] == [reused]  # remote is still fresh
        time.sleep(0.05)
        marked = {d.run_id: d.reason for d in led.mark_dead_runs_interrupted(timeout_s=0.01)}
        assert set(marked) == {reused, remote}
        assert "later process" in marked[reused]
        assert "gpu-node-7" in marked[remote] and "no heartbeat" in marked[remote]
        assert led.current_status(remote).status == "interrupted"
