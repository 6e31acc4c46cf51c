"""FSDP that shards before it loads, on CPU: host RAM per rank, losses, checkpoint (B4).

    .venv/bin/python benchmarks/bench_fsdp_from_meta.py [--layers 20]

A Llama-shaped base of >= 300M parameters is built from config (random weights, fp32, saved as
safetensors) under the generated extraction campaign with LoRA on q/v and activation
checkpointing (as torchtune's 70B LoRA recipe runs). Runs of the same 2 updates, 1 example per
microbatch:

- `meta`: 2 gloo ranks, FSDP from meta (`train/sharded_build.py`): shards first, then each
  rank reads its own rows of the safetensors;
- `load`: 2 gloo ranks, the whole base loaded on every rank, then sharded (what a
  load-then-`fully_shard` recipe does);
- `single`: one process, accumulation 2 (the same examples per update);
- with `--compare-load` also `load` and `meta` under glibc's default mmap threshold, which
  `tunepilot run` replaces on CPU (`jobs.MMAP_THRESHOLD`: freed tensors otherwise stay in
  the heap, and a rank's RSS grows while its live tensors do not).

Host memory is each rank's peak RSS (VmHWM, reset through /proc/self/clear_refs after the
imports and the process group) above its RSS at that moment, over the bytes of one full copy
of the base's weights: the build, the fill and both updates are inside the window. Goal: the
`meta` ranks <= 0.65x. The losses of `meta` must equal `single`'s within the float32 tolerance
of a different summation order (1e-5 relative), and its checkpoint must hold the files and
tensors one process writes. One interleaved run; the ratios are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, os, sys
from pathlib import Path
spec = json.loads(Path(sys.argv[1]).read_text())
from tunepilot.train import distributed
ctx = distributed.init_process_group_from_env()
from tunepilot.data.workspace import Workspace
from tunepilot.experiments.runner import Session, pad_id_of
from tunepilot.experiments.worker import distributed_campaign
from tunepilot.train.loop import train

ws = Workspace.open(spec["campaign"])
session = Session(ws)
campaign = distributed_campaign(ws, "control", 0, "fsdp", ctx.world_size)
encoded = session.encoded(campaign) if ctx.is_main else None
distributed.barrier()
encoded = encoded or session.encoded(campaign)

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

Path("/proc/self/clear_refs").write_text("5")
base = status("VmRSS")
if spec["mode"] == "meta":
    from tunepilot.train.sharded_build import build_sharded_model
    model = build_sharded_model(campaign, ws.model_source, ctx, 0, ws.tokenizer.pad_token_id)
else:
    model = distributed.wrap_model(session.build_model(campaign, 0), "fsdp", ctx)
built = status("VmHWM")
train(model, encoded.train, campaign.training, Path(spec["run_dir"]), kind="causal_lm",
      pad_id=pad_id_of(ws.tokenizer), rank=ctx.rank, world_size=ctx.world_size, progress=False)
peak = status("VmHWM")
line = json.dumps({"rank": ctx.rank, "base": base, "built": built, "peak": peak}) + "\n"
os.write(1, line.encode())
distributed.shutdown(ctx)
from tunepilot.experiments.worker import exit_now
exit_now(0)
"""

GIB = 2**30


def make_campaign(folder: Path, layers: int) -> tuple[Path, int]:
    """The extraction demo with a Llama base of `layers` x ~16.8M-parameter blocks."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tunepilot.demo.campaign import write_demo_campaign

    path = write_demo_campaign(folder, "extraction", tiny=True, n_conversations=40, overrides={
        "model.method": "lora", "model.lora.target_modules": ["q_proj", "v_proj"],
        "training.microbatch": 1, "training.accumulation": 1, "training.budget.updates": 2,
        "training.lr": 1e-3, "data.max_length": 256, "training.eval_every": 1000,
        "training.checkpoint_every": None, "training.max_grad_norm": 1.0,
        "training.activation_checkpointing": True,
    })  # fmt: skip
    model_dir = folder / "base-model"
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    config = LlamaConfig(vocab_size=len(tok), hidden_size=1024, intermediate_size=4096,
                         num_hidden_layers=layers, num_attention_heads=16,
                         num_key_value_heads=16, pad_token_id=tok.pad_token_id,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for stale in model_dir.glob("model*.safetensors*"):
        stale.unlink()
    model.save_pretrained(str(model_dir), safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    del model
    print(f"base: {params / 1e6:.0f}M parameters, one full copy {full_bytes / GIB:.2f} GiB (fp32)")
    return path, full_bytes


def launch(folder: Path, campaign: Path, mode: str, env: dict[str, str], label: str) -> list[dict]:
    run_dir = folder / f"run-{label}"
    spec = folder / f"{label}.json"
    spec.write_text(json.dumps({"campaign": str(campaign), "mode": mode, "run_dir": str(run_dir)}))
    (folder / "child.py").write_text(CHILD)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(folder / "child.py"), str(spec)],
        capture_output=True, text=True, timeout=3000, env={**os.environ, **env},
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{done.stderr[-3000:]}")
    return [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]


def single(folder: Path, campaign: Path) -> None:
    """The same updates in this process: accumulation 2 = 2 ranks x accumulation 1."""
    import torch

    from tunepilot.data.workspace import Workspace
    from tunepilot.experiments.runner import Session, pad_id_of, run_campaign_for
    from tunepilot.train.loop import train

    torch.set_num_threads(1)  # as each torchrun rank (OMP_NUM_THREADS=1)
    ws = Workspace.open(campaign, ["training.accumulation=2"])
    session = Session(ws)
    c = run_campaign_for(ws, "control", 0)
    train(session.build_model(c, 0), session.encoded(c).train, c.training, folder / "run-single",
          kind="causal_lm", pad_id=pad_id_of(ws.tokenizer), progress=False)


def curve(run_dir: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def same_checkpoint(a: Path, b: Path) -> str:
    from safetensors.torch import load_file

    steps = [sorted((d / "checkpoints").iterdir())[-1] for d in (a, b)]
    names = [sorted(p.name for p in s.iterdir()) for s in steps]
    if names[0] != names[1]:
        return f"files differ: {names[0]} vs {names[1]}"
    worst = 0.0
    for name in ("adapter_model.safetensors", "optimizer.safetensors"):
        x, y = load_file(str(steps[0] / name)), load_file(str(steps[1] / name))
        if x.keys() != y.keys():
            return f"{name}: tensor names differ"
        for key in x:
            gap = float((x[key].float() - y[key].float()).abs().max())
            worst = max(worst, gap / max(float(y[key].float().abs().max()), 1e-12))
    return f"same files and tensor names; largest relative gap {worst:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--compare-load", action="store_true",
                        help="also run the load-then-shard path and glibc's default threshold")
    args = parser.parse_args()
    from tunepilot.experiments.jobs import MMAP_THRESHOLD

    folder = Path(tempfile.mkdtemp(prefix="bench-fsdp-meta-"))
    campaign, full = make_campaign(folder, args.layers)
    fixed = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}  # what `tunepilot run` sets
    rows = {"meta": launch(folder, campaign, "meta", fixed, "meta")}
    if args.compare_load:
        rows["load"] = launch(folder, campaign, "load", fixed, "load")
        rows["meta, glibc's default threshold"] = launch(folder, campaign, "meta", {}, "default")
    single(folder, campaign)
    print("| path | rank | RSS at start | peak RSS above it, build + 2 updates | / one full copy |")
    print("|---|---:|---:|---:|---:|")
    for mode, ranks in rows.items():
        for r in sorted(ranks, key=lambda r: r["rank"]):
            above = r["peak"] - r["base"]
            print(f"| {mode} | {r['rank']} | {r['base'] / GIB:.2f} GiB | {above / GIB:.2f} GiB | "
                  f"{above / full:.2f}x |")
    worst = max((r["peak"] - r["base"]) / full for r in rows["meta"])
    print(f"\nFSDP from meta, worst rank: {worst:.2f}x one full copy (goal <= 0.65x): "
          f"{'PASS' if worst <= 0.65 else 'FAIL'}")
    meta, one = curve(folder / "run-meta"), curve(folder / "run-single")
    gap = max(abs(x - y) / abs(y) for x, y in zip(meta, one, strict=True))
    print(f"losses, FSDP from meta: {meta}\nlosses, one process:    {one}\n"
          f"largest relative gap {gap:.1e} (tolerance 1e-5): {'PASS' if gap <= 1e-5 else 'FAIL'}")
    same = same_checkpoint(folder / "run-meta", folder / "run-single")
    print(f"checkpoint vs one process: {same}")


if __name__ == "__main__":
    main()
