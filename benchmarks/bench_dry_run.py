"""How long the GPU-free dry run takes: Llama-3-8B and 70B LoRA at microbatch 2 x 2048.

    .venv/bin/python benchmarks/bench_dry_run.py [--threads N]

Goals on this 2-core CPU: 8B <= 60 s, 70B <= 120 s. The campaign is the demo extraction
campaign (a causal LM that generates its answers) with model.name_or_path set to the shipped
configs, LoRA r=8 on q_proj/v_proj, microbatch 2, data.max_length 2048. Each run is timed in
the same process, interleaved (8B, 70B, 8B, 70B); the figure is the median, with wall and CPU
seconds (on a shared machine the wall time can be several times the CPU time: the load
average is printed) and the ratio to the goal. Imports (torch, transformers, peft) are timed
apart: a command pays them once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

GOALS = {"llama-3-8b-config": 60.0, "llama-3-70b-config": 120.0}
SHAPE = ["model.method=lora", "training.microbatch=2", "data.max_length=2048",
         "training.activation_checkpointing=false"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    args = parser.parse_args()

    started = time.monotonic()
    import peft  # noqa: F401
    import torch
    import transformers  # noqa: F401

    from tunepilot.data.workspace import Workspace
    from tunepilot.demo.campaign import write_demo_campaign
    from tunepilot.measure.memory import human_bytes
    from tunepilot.sizing.dry_run.run import dry_run

    print(f"imports: {time.monotonic() - started:.1f} s wall")
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="bench-dry-run-"))
    path = write_demo_campaign(folder, "extraction", tiny=True, n_conversations=40,
                               overrides={"data.fields.time": None})  # fmt: skip
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in GOALS}
    last = {}
    for _ in range(args.rounds):
        for name in GOALS:
            ws = Workspace.open(path, [f"model.name_or_path={name}", *SHAPE])
            wall, cpu = time.monotonic(), time.process_time()
            last[name] = dry_run(ws)
            times[name].append((time.monotonic() - wall, time.process_time() - cpu))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'model':<22}{'wall s':>9}{'cpu s':>8}{'goal s':>8}{'ratio':>7}  peak (phase); "
          "steady step")
    for name, goal in GOALS.items():
        wall = statistics.median(t[0] for t in times[name])
        cpu = statistics.median(t[1] for t in times[name])
        peak, steady = last[name].peak(), last[name].phase("steady step")
        print(f"{name:<22}{wall:>9.1f}{cpu:>8.1f}{goal:>8.0f}{wall / goal:>7.2f}  "
              f"{human_bytes(peak.peak)} ({peak.phase}); {human_bytes(steady.peak)}")  # fmt: skip
    eval_shape = last[next(iter(GOALS))].phase("evaluation").inputs
    print(f"evaluation is sized at the campaign's eval batch {eval_shape['microbatch']} x "
          f"{eval_shape['length']} tokens with full-vocabulary fp32 logits, as evaluate runs it")
    print("ratio = median wall seconds / goal; under 1.00 meets the goal")


if __name__ == "__main__":
    main()
