"""The checks that need a CUDA GPU, in one script that finishes in minutes on one card.

    python benchmarks/bench_gpu.py [--only tf32,adamw,syncs,8bit] [--layers 8]

Each section prints a markdown table row and a verdict; nothing here runs on a CPU (it exits
saying so). Sections, each against what a user would otherwise pick:

- `tf32`: one training step of a Llama-shaped model (hidden 2048, `--layers` blocks, fp32
  weights, training.precision fp32) with `training.tf32` true vs false, through the loop's own
  switch (`train.runtime.cuda_switches`): median step time, interleaved, ratio off / on.
- `adamw`: `optimizer.step()` over the same model's parameters, fused (what tunepilot builds on
  CUDA) vs foreach (torch's default before): median time, ratio foreach / fused.
- `syncs`: the real loop (`train.loop.train`) for 6 updates of the tiny Llama under
  `torch.cuda.set_sync_debug_mode("warn")`: host syncs counted per update (goal: 1, where the
  loss and gradient norm are read together), set-up and the first update excluded.
- `8bit`: bitsandbytes' AdamW8bit and PagedAdamW8bit over a model's parameters after one step:
  the state tensors' bytes vs the dry run's `bitsandbytes_state_bytes`, and the allocator's
  growth at the step (paged state must not appear in it). Skipped, saying so, without
  bitsandbytes.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

GIB = 2**30


def _model(layers: int, dtype: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                         num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=16,
                         tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to("cuda", dtype)


def _timed(fn: Any, repeats: int) -> float:
    import torch

    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        tick = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - tick)
    return statistics.median(times[1:])  # the first is warm-up


def tf32(layers: int) -> None:
    import torch

    from tunepilot.campaign import TrainingSettings
    from tunepilot.train.runtime import cuda_switches

    model = _model(layers, torch.float32)
    ids = torch.randint(0, 32000, (2, 1024), device="cuda")

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    medians: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(3):  # interleaved
        for on in (True, False):
            with cuda_switches(TrainingSettings(tf32=on), torch.device("cuda")):
                medians[on].append(_timed(step, 4))
    on, off = statistics.median(medians[True]), statistics.median(medians[False])
    print(f"| tf32 | step, fp32, 2 x 1024, {layers} blocks | TF32 on {on:.3f} s, off {off:.3f} s "
          f"| off / on = {off / on:.2f}x |")  # fmt: skip


def adamw(layers: int) -> None:
    import torch

    model = _model(layers, torch.float32)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    params = list(model.parameters())
    kernels = {"fused": torch.optim.AdamW(params, lr=1e-5, fused=True),
               "foreach": torch.optim.AdamW(params, lr=1e-5, foreach=True)}  # fmt: skip
    medians: dict[str, list[float]] = {k: [] for k in kernels}
    for _ in range(3):
        for name, optimizer in kernels.items():
            medians[name].append(_timed(optimizer.step, 5))
    fused, foreach = (statistics.median(medians[k]) for k in ("fused", "foreach"))
    count = sum(p.numel() for p in params)
    print(f"| adamw | step over {count / 1e6:.0f}M fp32 parameters | fused {fused * 1e3:.1f} ms, "
          f"foreach {foreach * 1e3:.1f} ms | foreach / fused = {foreach / fused:.2f}x |")


def syncs() -> None:
    import tempfile
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM

    from tunepilot.campaign import TrainingSettings
    from tunepilot.model.tiny import DEFAULT_CORPUS, build_tiny_llama
    from tunepilot.tasks.base import IGNORE_INDEX, Encoded
    from tunepilot.train.loop import train

    folder = Path(tempfile.mkdtemp(prefix="bench-gpu-syncs-"))
    build_tiny_llama(folder / "model")
    model = AutoModelForCausalLM.from_pretrained(str(folder / "model")).to("cuda")
    data = [Encoded(f"e{i}", list(range(3, 40)), [IGNORE_INDEX] + list(range(4, 40)), 1, False,
                    False, 37) for i in range(len(DEFAULT_CORPUS) * 4)]  # fmt: skip
    settings = TrainingSettings(microbatch=2, accumulation=4, budget={"updates": 6},
                                checkpoint_every=100, precision="bf16")  # fmt: skip
    per_update: list[int] = []
    seen: list[int] = [0]

    def count(_: dict) -> None:
        per_update.append(seen[0])
        seen[0] = 0

    def on_warning(message: Any, *rest: Any) -> None:
        if "synchroniz" in str(message).lower():
            seen[0] += 1

    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        before = warnings.showwarning
        warnings.showwarning = on_warning
        try:
            train(model, data, settings, folder / "run", kind="causal_lm", pad_id=0,
                  on_update=count, progress=False)  # fmt: skip
        finally:
            warnings.showwarning = before
            torch.cuda.set_sync_debug_mode("default")
    steady = per_update[1:]  # the first update includes set-up
    verdict = "PASS" if steady and max(steady) <= 1 else "FAIL"
    print(f"| syncs | host syncs per update, updates 2-6 | {steady} | goal 1: {verdict} |")


def eight_bit() -> None:
    import importlib.util

    import torch

    from tunepilot.sizing.dry_run.optimizers import bitsandbytes_state_bytes

    if importlib.util.find_spec("bitsandbytes") is None:
        print("| 8bit | bitsandbytes not installed | not measured | - |")
        return
    import bitsandbytes as bnb

    for kind in (bnb.optim.AdamW8bit, bnb.optim.PagedAdamW8bit):
        model = _model(2, torch.bfloat16)
        params = list(model.parameters())
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer = kind(params, lr=1e-5)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        optimizer.step()
        torch.cuda.synchronize()
        grew = torch.cuda.memory_allocated() - before
        held = sum(v.numel() * v.element_size() for s in optimizer.state.values()
                   for k, v in s.items()
                   if isinstance(v, torch.Tensor) and not k.startswith("qmap"))  # fmt: skip
        sized = sum(bitsandbytes_state_bytes(p.numel()) for p in params)
        print(f"| 8bit | {kind.__name__} state over {sum(p.numel() for p in params) / 1e6:.0f}M "
              f"parameters | held {held / GIB:.3f} GiB, dry run {sized / GIB:.3f} GiB, allocator "
              f"grew {grew / GIB:.3f} GiB | held / dry run = {held / sized:.3f} |")  # fmt: skip
        del optimizer, model, params
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="tf32,adamw,syncs,8bit")
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: these checks run only where a GPU is visible; "
                         "nothing was measured")
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print("| check | what | measured | ratio / verdict |\n|---|---|---|---|")
    sections = {"tf32": lambda: tf32(args.layers), "adamw": lambda: adamw(args.layers),
                "syncs": syncs, "8bit": eight_bit}  # fmt: skip
    for name in args.only.split(","):
        sections[name]()


if __name__ == "__main__":
    main()
