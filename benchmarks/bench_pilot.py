"""How long the whole pilot takes on the MiniLM banking77 campaign (goal < 90 s on this CPU).

    .venv/bin/python benchmarks/bench_pilot.py [--threads N] [--keep DIR]

The campaign is examples/banking77/campaign.yaml (MiniLM + LoRA, 77 intents, 13k queries),
copied into a scratch folder with the data paths pointed at the shared data folder; without
that folder the demo campaign (MiniLM, generated tickets) is used instead, and the output
says which. All 13 gates run for real, the resume and export child processes included; the
memory grid and the plan at the end are part of the time. Each gate's time is printed, then
the total, with the load average: on a shared machine, other work on the cores can multiply
the time (try --threads 1 there).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "banking77" / "campaign.yaml"
RELATIVE = "../../../shared/data"


def shared_data() -> Path | None:
    for candidate in (REPO.parent / "shared" / "data", Path("/work/shared/data")):
        if (candidate / "banking77" / "train.csv").is_file():
            return candidate
    return None


def write_campaign(folder: Path) -> tuple[Path, str]:
    """The banking77 campaign with absolute data paths, or the demo campaign."""
    data = shared_data()
    if data is not None:
        text = EXAMPLE.read_text(encoding="utf-8").replace(RELATIVE, str(data))
        path = folder / "campaign.yaml"
        path.write_text(text, encoding="utf-8")
        return path, "examples/banking77 (MiniLM, banking77)"
    from tunepilot.demo.campaign import write_demo_campaign

    return write_demo_campaign(folder, "classification"), "the demo campaign (MiniLM, tickets)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--keep", type=Path, default=None, help="keep the campaign folder here")
    args = parser.parse_args()

    import torch

    from tunepilot.data.workspace import Workspace
    from tunepilot.pilot.flow import execute_pilot

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-pilot-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        path, label = write_campaign(folder)
        ws = Workspace.open(path)
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        result = execute_pilot(ws)
        total = time.perf_counter() - start
        for row in result.rows:
            took = f"{row.duration_s:7.2f} s" if row.duration_s is not None else "    -    "
            print(f"{row.number:>2} {row.phase:<13} {took}  {row.verdict}")
        gates = sum(r.duration_s or 0.0 for r in result.rows)
        print(f"gates {gates:.1f} s; memory grid, sizing and plan {total - gates:.1f} s")
        load = f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
        print(f"torch threads {torch.get_num_threads()}, {os.cpu_count()} cores, {load}")
        print(f"pilot on {label}: {total:.1f} s (goal < 90 s)")
        if result.failed:
            raise SystemExit("a gate FAILed: see " + str(result.folder / "gates.json"))
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
