"""The dossier, `compare --json` and an Axolotl conversion at scale: CPU seconds and bytes.

    .venv/bin/python benchmarks/bench_scale.py [--variants 249] [--seeds 20] [--axolotl-keys 550000]

A campaign of (1 + variants) x seeds recorded runs (5,000 by default: 250 configurations x 20
seeds, one in fifty diverged, one in a hundred failed) is written through the ledger's API with
the files the runner leaves (tests/scale_support.py; generating is not timed). Then, each in
this process: `compare --json` (the decision, 249 paired bootstraps of 2,000 resamples), the
report (collect + render + write), and `init --from-axolotl` on a 50 MB config holding 550,000
keys no campaign has. Printed: CPU seconds, wall seconds, bytes written. Before these bounds
(main of 2026-12-01, measured the same way on a 5,000-run folder): the report 35.8 CPU-s and
14.3 MB, compare 7.8 s and 10 MB, the Axolotl file 165 s and 44 MB on stderr.

The dossier's structure at scale (what is drawn, what is summarised) is asserted in
tests/test_scale.py, never a time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def timed(label: str, call, size) -> None:  # noqa: ANN001 (a callable and what it wrote)
    from tunepilot.errors import describe_bytes

    cpu, wall = time.process_time(), time.perf_counter()
    result = call()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"{label:<34} {cpu:7.2f} CPU-s {wall:7.2f} s wall {describe_bytes(size(result)):>10}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", type=int, default=249)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--axolotl-keys", type=int, default=550_000)
    args = parser.parse_args()

    from scale_support import write_scale_campaign
    from tunepilot.campaign.axolotl import not_carried_lines, write_from_axolotl
    from tunepilot.data.workspace import Workspace
    from tunepilot.experiments.compare import compare_command
    from tunepilot.report.flow import write_report

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runs = (1 + args.variants) * args.seeds
        start = time.perf_counter()
        path = write_scale_campaign(root / "c", "minilm", args.variants, args.seeds)
        print(f"generated {runs:,} runs in {time.perf_counter() - start:.0f} s (not timed)")
        ws = Workspace.open(path)

        def compare() -> str:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                compare_command(ws, as_json=True)
            return out.getvalue()

        timed(f"compare --json ({runs:,} runs)", compare, len)
        timed(f"report ({runs:,} runs)", lambda: write_report(ws)[0], lambda p: p.stat().st_size)

        lines = ["base_model: ./model", "adapter: lora", "learning_rate: 0.0002"]
        pad = "x" * 24  # 550,000 keys make a 50 MB file
        lines += [f"unknown_setting_number_{i:07d}: 'a value nobody maps here {i:07d} {pad}'"
                  for i in range(args.axolotl_keys)]
        source = root / "big.yml"
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"Axolotl config: {source.stat().st_size / 1e6:.1f} MB, "
              f"{args.axolotl_keys:,} unknown keys")

        def convert() -> str:
            _, unknown = write_from_axolotl(root / "converted", source)
            return "\n".join(not_carried_lines(unknown, source))  # what stderr shows

        timed("init --from-axolotl (stderr part)", convert, lambda text: len(text.encode()))


if __name__ == "__main__":
    main()
