"""Every check that needs a CUDA GPU, in one call that ends inside 8 minutes on one card.

    python benchmarks/gpu_checks.py [--budget 450] [--only name,name]

The CPU tests cannot see what only a GPU shows: TF32 and fused AdamW speed, host syncs per
update, bitsandbytes' state bytes, the allocator's allocated/reserved split per phase, the
dry run against `torch.cuda.max_memory_allocated`, the planned against the measured tokens per
second. Each of those lives in its own script (run alone while working on it); this one runs
them all, one after another, each in its own process under its share of `--budget` seconds,
and prints one markdown table: section, exit status, seconds, and the section's last lines.

On the lent device machine, which has torch but none of tunepilot's dependencies, carry
wheels (transformers, peft, accelerate, safetensors, tokenizers, pydantic, pyyaml, typer,
rich, psutil, bitsandbytes ...) and tunepilot itself on PYTHONPATH:

    pip install --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:src python benchmarks/gpu_checks.py | tee $OUT/gpu.md

Exits 2 without a GPU (nothing was measured), 1 when a section failed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (name, script and its arguments, share of the budget): the order puts the cheap, decisive
# checks first so that a budget cut short still brings them back.
SECTIONS: list[tuple[str, list[str], float]] = [
    ("versions and phase memory", ["gpu_versions_and_memory.py"], 0.10),
    ("tf32, fused adamw, host syncs, 8-bit state", ["bench_gpu.py"], 0.30),
    ("dry run vs max_memory_allocated (bf16 base)",
     ["bench_dry_run_validate.py", "--device", "cuda", "--base-dtype", "bf16"], 0.30),
    ("planned vs measured tokens/s", ["bench_dry_run_validate.py", "--device", "cuda",
                                      "--throughput"], 0.30),
]  # fmt: skip


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds for all sections together (default 450: 7.5 minutes)")
    parser.add_argument("--only", default="", help="comma-separated words of section names")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device visible (torch.cuda.is_available() is False): nothing measured",
              file=sys.stderr)  # fmt: skip
        return 2
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    sections = [s for s in SECTIONS if not wanted or any(w in s[0] for w in wanted)]
    share_total = sum(share for *_, share in sections) or 1.0
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    rows, failed, started = [], 0, time.monotonic()
    print(f"# GPU checks on {torch.cuda.get_device_name(0)}, torch {torch.__version__}\n")
    for name, argv, share in sections:
        left = args.budget - (time.monotonic() - started)
        limit = max(10.0, min(left, args.budget * share / share_total))
        begun = time.monotonic()
        try:
            done = subprocess.run([sys.executable, str(HERE / argv[0]), *argv[1:]], env=env,
                                  capture_output=True, text=True, timeout=limit)  # fmt: skip
            status, out = str(done.returncode), done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            status = f"timed out at {limit:.0f} s"
            out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout
                                                                                      or "")
        failed += status != "0"
        rows.append((name, status, time.monotonic() - begun, out))
        print(f"## {name}: exit {status}, {time.monotonic() - begun:.0f} s\n")
        print("```\n" + _tail(out, 40) + "\n```\n", flush=True)
    print("| section | exit | seconds |\n|---|---|---|")
    for name, status, seconds, _ in rows:
        print(f"| {name} | {status} | {seconds:.0f} |")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
