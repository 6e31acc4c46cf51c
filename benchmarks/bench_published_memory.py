"""The dry run next to published memory figures for well-known fine-tuning setups (S1, on
paper), printed as the markdown table kept in docs/sizing-validation.md.

    .venv/bin/python benchmarks/bench_published_memory.py [--only NAME]

Each setup is written as a tunepilot campaign (the generated extraction tickets as data; only
the shape matters) with the published model, method, LoRA targets and rank, base dtype,
microbatch, length and activation checkpointing, then sized by `sizing.dry_run` on the CUDA
path. No GPU and no weights: the model is built from its config.json. The prediction printed
is the highest training phase's tensor peak (first or steady step), the figure an allocator's
`max_memory_allocated` would show, then the ratio predicted / published. Where the publication
gives a per-GPU figure under FSDP, the FSDP arithmetic of the per-card sheet is applied.

The published figures differ from the sized step in ways the table names: torchtune trains the
LoRA weights in bf16 and chunks the output loss, tunepilot keeps trained weights in fp32 and
computes the full logits; whether a figure is allocated or reserved memory is not always said.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

GIB = 2**30
TORCHTUNE = (
    "pytorch/torchtune README.md, 'Memory and training speed' table (commit bd2a0fc7c, "
    "2026-04-23): batch size 2, no accumulation, packed to 2048 tokens, torch.compile on"
)
LLAMA_65B = {  # LLaMA (Touvron et al. 2023, Table 2) as converted to transformers
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
    "intermediate_size": 22016, "num_hidden_layers": 80, "num_attention_heads": 64,
    "num_key_value_heads": 64, "vocab_size": 32000, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
}  # fmt: skip
MLP_AND_ATTN = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class Setup:
    name: str
    source: str
    published: str  # as printed in the source
    published_bytes: float | None  # None: a bound, not a figure
    model: str  # shipped config name, or "llama-65b" (written here)
    overrides: dict[str, object]
    gpus: int = 1
    notes: list[str] = field(default_factory=list)


def torchtune_8b(name: str, config: str, published: float, base: str, ckpt: bool,
                 notes: list[str] | None = None) -> Setup:  # fmt: skip
    """A row of torchtune's table for Llama 3.1 8B (LoRA r 8 on q, v, o and the MLP)."""
    return Setup(name, f"{TORCHTUNE}; config llama3_1/{config}", f"{published} GiB",
                 published * GIB, "llama-3-8b-config",
                 {"model.lora.r": 8, "model.lora.alpha": 16,
                  "model.lora.target_modules": MLP_AND_ATTN, "model.base_dtype": base,
                  "training.microbatch": 2, "training.activation_checkpointing": ckpt},
                 notes=notes or [])  # fmt: skip


SETUPS = [
    torchtune_8b("Llama 3.1 8B LoRA, 1x RTX 4090", "8B_lora_single_device", 16.2, "bf16", True),
    torchtune_8b("Llama 3.1 8B LoRA, 1x A6000", "8B_lora_single_device", 30.3, "bf16", False,
                 ["the README does not say what differs from the 4090 row; sized without "
                  "activation checkpointing, the one switch that doubles it"]),
    torchtune_8b("Llama 3.1 8B QLoRA, 1x RTX 4090", "8B_qlora_single_device", 7.4, "nf4", True),
    Setup("Llama 3.1 70B LoRA, 8x A100 (FSDP)", TORCHTUNE + "; config llama3_1/70B_lora",
          "27.6 GiB per GPU", 27.6 * GIB, "llama-3-70b-config",
          {"model.lora.r": 16, "model.lora.alpha": 32, "model.lora.target_modules": MLP_AND_ATTN,
           "model.base_dtype": "bf16", "training.microbatch": 2,
           "training.activation_checkpointing": True}, gpus=8),
    Setup("LLaMA 65B QLoRA (Guanaco), 1 GPU",
          "Dettmers et al., QLoRA (arXiv:2305.14314), abstract: 'finetune a 65B parameter model "
          "on a single 48GB GPU'; settings from artidoro/qlora scripts/finetune_guanaco_65b.sh "
          "(r 64, alpha 16, all linear layers, nf4 + double quant, bf16, gradient checkpointing, "
          "4 x (16 + 512) tokens, paged AdamW)",
          "< 48 GB", None, "llama-65b",
          {"model.lora.r": 64, "model.lora.alpha": 16, "model.lora.target_modules": ALL_LINEAR,
           "model.base_dtype": "nf4", "training.microbatch": 4,
           "training.activation_checkpointing": True},
          notes=["max length 528 = source 16 + target 512"]),
]  # fmt: skip
LENGTH = {"LLaMA 65B QLoRA (Guanaco), 1 GPU": 528}


def campaign_for(setup: Setup, folder: Path) -> Path:
    """The demo extraction campaign with the setup's model, method and shape."""
    from tunepilot.demo.campaign import write_demo_campaign

    model = setup.model
    if model == "llama-65b":
        (folder / "llama-65b").mkdir(parents=True, exist_ok=True)
        (folder / "llama-65b" / "config.json").write_text(json.dumps(LLAMA_65B))
        model = str(folder / "llama-65b")
    overrides = {"model.name_or_path": model, "model.method": "lora", "model.lora.dropout": 0.0,
                 "model.lora.modules_to_save": [], "training.precision": "bf16",
                 "data.max_length": LENGTH.get(setup.name, 2048),
                 "training.eval_batch_size": 2, **setup.overrides}  # fmt: skip
    return write_demo_campaign(folder, "extraction", tiny=True, n_conversations=40,
                               overrides=overrides)  # fmt: skip


def predict(setup: Setup) -> tuple[float, str, float, str]:
    """(predicted bytes per GPU, which phase, seconds the dry run took, its split in GiB)."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.sizing.dry_run.run import dry_run
    from tunepilot.sizing.fit import FSDP, TRAINING_PHASES, Layout, per_gpu_bytes

    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace.open(campaign_for(setup, Path(tmp)))
        tick = time.perf_counter()
        dry = dry_run(ws)
        seconds = time.perf_counter() - tick
    training = max((p for p in dry.phases if p.phase in ("first step", "steady step")),
                   key=lambda p: p.peak)  # fmt: skip
    split = " / ".join(f"{getattr(training, k) / GIB:.1f}" for k in
                       ("weights", "gradients", "optimizer", "activations", "temporaries"))
    if setup.gpus > 1:
        sharded = per_gpu_bytes(dry, Layout(FSDP, setup.gpus))
        phase = max(TRAINING_PHASES, key=lambda k: sharded[k])
        return float(sharded[phase]), f"{phase}, FSDP over {setup.gpus}", seconds, split
    return float(training.peak), training.phase, seconds, split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run the setups whose name contains this text")
    args = parser.parse_args()
    rows = [s for s in SETUPS if not args.only or args.only.lower() in s.name.lower()]
    print("| setup | published | dry run predicts | one GPU's split W / G / O / A / T, GiB "
          "| predicted / published | source |")
    print("|---|---:|---:|---|---:|---|")
    for setup in rows:
        predicted, phase, seconds, split = predict(setup)
        if setup.published_bytes:
            ratio = f"{predicted / setup.published_bytes:.2f}"
        else:  # a bound: "a single 48GB GPU" (GPU memory comes in binary sizes: 48 GiB)
            ratio = "fits" if predicted < 48 * GIB else "does not fit"
        notes = "; ".join(setup.notes)
        print(f"| {setup.name} | {setup.published} | {predicted / GIB:.1f} GiB ({phase}, "
              f"{seconds:.0f} s) | {split} | {ratio} | "
              f"{setup.source}{'; ' + notes if notes else ''} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
