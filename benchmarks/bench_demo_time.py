"""The demos' wall time, CPU time and outcome: the figures `tunepilot demo --help` and the
README state, to be measured on a quiet 2-core machine (nothing else running).

    python benchmarks/bench_demo_time.py                      # all four demos
    python benchmarks/bench_demo_time.py extraction image     # some of them

Each demo runs as the user runs it (`tunepilot demo DIR [--task T] [--quick]`) in a new
folder. Printed per demo: wall seconds, CPU seconds of the process tree (user + system: the
work, whatever else the machine does), the machine's 1-minute load average before and after
(above ~0.5 the wall figure is not a quiet machine's), the exit code, and whether a bundle
was delivered and verified. The goal for the full classification demo (`make demo`) is under
10 minutes of wall time on a quiet 2-core machine; a demo that exits non-zero or delivers no
verified bundle is a FAIL whatever its time.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEMOS = {
    "quick": ["--quick"],
    "classification": [],
    "extraction": ["--task", "extraction"],
    "image": ["--task", "image"],
}
GOAL_S = {"classification": 600.0}


def verified(folder: Path) -> bool:
    """A bundle under exports/ whose verification record says PASS."""
    records = list((folder / "exports").glob("*.verification.json"))
    return any(json.loads(p.read_text()).get("verdict") == "PASS" for p in records)


def run(name: str, root: Path) -> str:
    folder = root / name
    before = os.getloadavg()[0]
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tunepilot.cli", "demo", str(folder),
                           *DEMOS[name]], capture_output=True, text=True, check=False)  # fmt: skip
    wall = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    ok = done.returncode == 0 and verified(folder)
    goal = GOAL_S.get(name)
    within = "" if goal is None else (" within" if wall <= goal else " OVER") + f" {goal:.0f} s"
    return (f"{name}: wall {wall:.0f} s{within}, CPU {cpu:.0f} s, load {before:.1f} -> "
            f"{os.getloadavg()[0]:.1f}, exit {done.returncode}, verified bundle "
            f"{'yes' if verified(folder) else 'no'}: {'PASS' if ok else 'FAIL'}")


def main() -> None:
    names = sys.argv[1:] or list(DEMOS)
    with tempfile.TemporaryDirectory(prefix="tunepilot-demo-bench-") as tmp:
        for name in names:
            print(run(name, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
