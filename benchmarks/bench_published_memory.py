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
LoRA weights in bf16 and chunks the output loss, tunepilot keeps trained weights in fp32 unless
`training.weights_dtype: bf16` (the full fine-tuning rows set it, with the recipe's optimizer
and optimizer-in-backward) and computes the full logits; whether a figure is allocated or
reserved memory is not always said.
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
LLAMA_32_3B = {  # meta-llama/Llama-3.2-3B config.json (its published architecture)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 3072,
    "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "rope_theta": 500000.0, "tie_word_embeddings": True,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}  # fmt: skip
PURE_BF16 = {"model.method": "full", "model.base_dtype": "bf16", "training.weights_dtype": "bf16",
             "training.precision": "fp32", "training.accumulation": 1,
             "training.max_grad_norm": None}  # fmt: skip
"""Pure bf16 full fine-tuning as torchtune's `dtype: bf16` runs it: every weight, gradient and
AdamW state in bf16, no autocast (fp32 precision over bf16 weights computes in bf16)."""
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
    Setup("Llama 3.1 8B full, 1x RTX 4090", f"{TORCHTUNE}; config llama3_1/"
          "8B_full_single_device (bitsandbytes PagedAdamW8bit, optimizer_in_bwd, activation "
          "checkpointing, dtype bf16)", "18.9 GiB", 18.9 * GIB, "llama-3-8b-config",
          {**PURE_BF16, "training.optimizer": "paged_adamw_8bit",
           "training.optimizer_in_backward": True, "training.microbatch": 2,
           "training.activation_checkpointing": True},
          notes=["the paged 8-bit AdamW state lives in CUDA unified memory, outside the "
                 "allocator whose peak torchtune logs: the dry run reports it apart"]),
    Setup("Llama 3.2 3B full, 1x A100", "torchtune README 'Memory and training speed' (Nov "
          "2024 revision): Llama 3.2 3B full finetune, pure bf16, torch AdamW, batch 2 x 4096 "
          "tokens, no activation checkpointing", "60.0 GiB", 60.0 * GIB, "llama-3.2-3b",
          {**PURE_BF16, "training.optimizer": "adamw", "training.microbatch": 2,
           "training.activation_checkpointing": False}),
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
LENGTH = {"LLaMA 65B QLoRA (Guanaco), 1 GPU": 528, "Llama 3.2 3B full, 1x A100": 4096}
CONFIGS = {"llama-65b": LLAMA_65B, "llama-3.2-3b": LLAMA_32_3B}


def campaign_for(setup: Setup, folder: Path) -> Path:
    """The demo extraction campaign with the setup's model, method and shape."""
    from tunepilot.demo.campaign import write_demo_campaign

    model = setup.model
    if model in CONFIGS:
        (folder / model).mkdir(parents=True, exist_ok=True)
        (folder / model / "config.json").write_text(json.dumps(CONFIGS[model]))
        model = str(folder / model)
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
    if training.host_paged:
        split += f" (+ {training.host_paged / GIB:.1f} paged, outside the allocator)"
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
