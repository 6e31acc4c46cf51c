"""Planned against published training throughput (L3): the calibration of `sizing.throughput`
and its check, printed as the markdown table kept in docs/sizing-validation.md.

    .venv/bin/python benchmarks/bench_published_throughput.py [--only NAME]

Each published setup is written as a tunepilot campaign (the generated extraction tickets as
data; only the shape matters: every row is sized at its full published length, as packed data
is) and sized by the dry run on the CUDA path, no GPU and no weights. From the steady step's
executed FLOPs per token and the card's dense peak, each row's reached utilisation is
`published tokens/s x FLOPs per token / (GPUs x peak)`. The calibration rows then give:

- LoRA: the geometric mean of the three single-GPU LoRA rows (low/high: their extremes);
- full fine-tuning: its one row;
- QLoRA's dequantisation share of the bandwidth: QLoRA's extra seconds per step over the LoRA
  row of the same card and publication, its extra LoRA FLOPs taken out at that row's rate;
- the FSDP scaling efficiency over 8: the 70B row's utilisation over the LoRA figure.

It prints those next to the constants shipped in `tunepilot/sizing/throughput.py`, then, with
the shipped constants and the plan's own code (`timing.computed_seconds`, `machine.
layout_seconds`), planned tokens/s over published tokens/s for every row: the calibration
rows (goal 0.8-1.25x) and rows held out of the calibration (how far the model carries).

Published tokens/s are torchtune's README tables (pytorch/torchtune): "Training Speed
(tokens/sec)" of 2024-05-09 (commit 0217d44c2), "Tokens/sec" of 2024-09-25 (commit
30b8519e8, "measured over one full training epoch"), and the optimization-flags table of
2024-11-18 (commit 1814feb17); the recipes count `tokens.numel()` of each batch, padding
included. The 70B figures are the machine's: per GPU they would need 4.5 times an A100's
dense peak at the dry run's FLOPs per token.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_published_memory import campaign_for  # noqa: E402

MAY, SEP, NOV = (f"torchtune README ({d}, commit {c})" for d, c in
                 (("2024-05-09", "0217d44c2"), ("2024-09-25", "30b8519e8"),
                  ("2024-11-18", "1814feb17")))  # fmt: skip
_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-5,
          "hidden_act": "silu", "tie_word_embeddings": False}  # fmt: skip
CONFIGS = {
    "llama-2-7b": _LLAMA | {"hidden_size": 4096, "intermediate_size": 11008,
                            "num_hidden_layers": 32, "num_attention_heads": 32,
                            "num_key_value_heads": 32, "vocab_size": 32000,
                            "max_position_embeddings": 4096},
    "llama-2-70b": _LLAMA | {"hidden_size": 8192, "intermediate_size": 28672,
                             "num_hidden_layers": 80, "num_attention_heads": 64,
                             "num_key_value_heads": 8, "vocab_size": 32000,
                             "max_position_embeddings": 4096},
    "llama-3.2-3b": _LLAMA | {"hidden_size": 3072, "intermediate_size": 8192,
                              "num_hidden_layers": 28, "num_attention_heads": 24,
                              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
                              "max_position_embeddings": 131072, "rope_theta": 500000.0,
                              "tie_word_embeddings": True},
}  # fmt: skip
QV, QKV = ["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj"]
QVO_MLP = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class Row:
    name: str
    source: str
    published: float  # tokens/s of the machine
    card: str  # a card of the shipped catalog
    model: str  # shipped config name or a key of CONFIGS
    method: str  # "lora" | "full"
    base: str  # model.base_dtype
    targets: list[str]
    r: int
    microbatch: int
    length: int
    ckpt: bool
    role: str  # "lora", "full", "qlora", "fsdp": calibrates that figure; "held out"
    note: str = ""

    @property
    def gpus(self) -> int:
        return 8 if self.card.startswith("8x") else 1


ROWS = [
    Row("Llama-2-7B LoRA r8 q,v, 4 x 2048, ckpt, 1x RTX 4090", MAY, 2582, "RTX 4090",
        "llama-2-7b", "lora", "bf16", QV, 8, 4, 2048, True, "lora",
        "alpaca padded to the longest of each batch, capped at 2048: sized at 2048, which "
        "overstates attention's FLOPs per token by up to 7%"),
    Row("Llama-3.1-8B LoRA r8 q,v, 2 x 2048 packed, ckpt, 1x RTX 4090", SEP, 3083, "RTX 4090",
        "llama-3-8b-config", "lora", "bf16", QV, 8, 2, 2048, True, "lora"),
    Row("Llama-3.1-8B QLoRA r8 all linear, same, 1x RTX 4090", SEP, 2413, "RTX 4090",
        "llama-3-8b-config", "lora", "nf4", ALL, 8, 2, 2048, True, "qlora",
        "the 8B_qlora_single_device config: LoRA on q, k, v, o and the MLP"),
    Row("Llama-3.1-70B LoRA r16 q,k,v, 2 x 2048 packed, ckpt, FSDP over 8x A100 80GB", SEP,
        3497, "8x A100 80GB", "llama-3-70b-config", "lora", "bf16", QKV, 16, 2, 2048, True,
        "fsdp"),
    Row("Llama-3.2-3B full bf16, 2 x 4096 packed, 1x A100 80GB", NOV, 7075, "A100 80GB",
        "llama-3.2-3b", "full", "bf16", QV, 8, 2, 4096, False, "full",
        "baseline + packed dataset row: no compile, no checkpointing"),
    Row("Llama-3.2-3B LoRA r64 q,v,o + MLP, 2 x 4096 packed, compile, chunked CE, ckpt, "
        "1x A100 80GB", NOV, 8210, "A100 80GB", "llama-3.2-3b", "lora", "bf16", QVO_MLP, 64, 2,
        4096, True, "lora", "the table adds LoRA on top of compile, chunked CE, activation "
        "checkpointing and offloading"),
    Row("Llama-2-70B LoRA r16 q,k,v, 4 x 4096, ckpt, FSDP over 8x A100 80GB", MAY, 3384,
        "8x A100 80GB", "llama-2-70b", "lora", "bf16", QKV, 16, 4, 4096, True, "held out",
        "alpaca padded, capped at 4096: sized at 4096"),
    Row("Llama-3.2-3B QLoRA r64 q,v,o + MLP, same as its LoRA row, 1x A100 80GB", NOV, 8035,
        "A100 80GB", "llama-3.2-3b", "lora", "nf4", QVO_MLP, 64, 2, 4096, True, "held out"),
    Row("Llama-3.1-8B LoRA r8 q,v, 2 x 2048 packed, 1x RTX A6000", SEP, 4699, "RTX A6000",
        "llama-3-8b-config", "lora", "bf16", QV, 8, 2, 2048, False, "held out",
        "30.3 GiB against 16.2 on the 4090: sized without activation checkpointing"),
    Row("Llama-3.1-8B full, 2 x 2048 packed, ckpt, 1x RTX 4090", SEP, 1650, "RTX 4090",
        "llama-3-8b-config", "full", "bf16", QV, 8, 2, 2048, True, "held out",
        "paged 8-bit AdamW fused into backward (its FLOPs are the same)"),
    Row("Llama-3.1-8B full, 2 x 2048 packed, ckpt, 1x RTX A6000", SEP, 2579, "RTX A6000",
        "llama-3-8b-config", "full", "bf16", QV, 8, 2, 2048, True, "held out",
        "paged 8-bit AdamW fused into backward (its FLOPs are the same)"),
]  # fmt: skip


def sized(row: Row, folder: Path) -> tuple[object, object, object]:
    """(dry run, WorkFlops, WorkBytes) of one row: one update = one microbatch per GPU."""
    from bench_published_memory import Setup

    from tunepilot.data.workspace import Workspace
    from tunepilot.sizing.dry_run.run import dry_run
    from tunepilot.sizing.sheet import sheet_inputs, work_of

    model = row.model
    if model in CONFIGS:
        (folder / model).mkdir(parents=True, exist_ok=True)
        (folder / model / "config.json").write_text(json.dumps(CONFIGS[model]))
        model = str(folder / model)
    overrides = {"model.method": row.method, "model.base_dtype": row.base,
                 "model.lora.r": row.r, "model.lora.alpha": 2 * row.r,
                 "model.lora.target_modules": row.targets, "training.microbatch": row.microbatch,
                 "training.accumulation": row.gpus,
                 "training.activation_checkpointing": row.ckpt}  # fmt: skip
    setup = Setup(row.name, row.source, "", None, model, overrides)
    LENGTH_OF[row.name] = row.length
    ws = Workspace.open(campaign_for(setup, folder / "campaign"))
    dry = dry_run(ws)
    inputs = sheet_inputs(ws.campaign, 100, 10, row.base)
    flops, io = work_of(dry, inputs)
    return dry, flops, io


LENGTH_OF: dict[str, int] = {}


def reached(row: Row, dry: object) -> float:
    """Utilisation the published figure implies: tokens/s x FLOPs per token / (GPUs x peak)."""
    from tunepilot.sizing.catalog import load_catalog

    steady = next(p for p in dry.phases if p.phase == "steady step")  # type: ignore[attr-defined]
    per_token = steady.flops / (row.microbatch * row.length)
    peak = load_catalog().card(row.card).peak_flops("bf16")
    return row.published * per_token / (row.gpus * peak)


def planned(row: Row, flops: object, io: object) -> float:
    """Machine tokens/s the plan's own code gives with the shipped constants."""
    from tunepilot.sizing.catalog import load_catalog
    from tunepilot.sizing.fit import FSDP, Layout
    from tunepilot.sizing.machine import layout_seconds
    from tunepilot.sizing.timing import computed_seconds

    catalog = load_catalog()
    card = catalog.card(row.card)
    seconds = computed_seconds(card, catalog, flops, io)  # type: ignore[arg-type]
    assert seconds is not None
    if row.gpus > 1:
        seconds, _, _ = layout_seconds(seconds, Layout(FSDP, row.gpus), accumulation=row.gpus)
    return row.gpus * row.microbatch * row.length / seconds.update


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run the rows whose name contains this text")
    args = parser.parse_args()
    import bench_published_memory

    bench_published_memory.LENGTH = LENGTH_OF  # campaign_for reads data.max_length from it
    from tunepilot.sizing import throughput as shipped

    rows = [r for r in ROWS if not args.only or args.only.lower() in r.name.lower()]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, row in enumerate(rows):
            dry, flops, io = sized(row, Path(tmp) / str(i))
            results[row.name] = (row, dry, flops, io, reached(row, dry))
    by_role: dict[str, list] = {}
    for row, dry, flops, io, u in results.values():
        by_role.setdefault(row.role, []).append((row, dry, flops, io, u))
    print("## Calibration (shipped constants in tunepilot/sizing/throughput.py)\n")
    lora = [x[4] for x in by_role.get("lora", [])]
    if lora:
        print(f"- LoRA utilisation: geometric mean {geomean(lora):.3f}, low {min(lora):.3f}, "
              f"high {max(lora):.3f} (shipped {shipped.LORA.expected}, {shipped.LORA.low}, "
              f"{shipped.LORA.high})")  # fmt: skip
    for _, _, _, _, u in by_role.get("full", []):
        print(f"- full fine-tuning utilisation: {u:.3f} (shipped {shipped.FULL.expected})")
    pair = [x for x in by_role.get("lora", []) if x[0].card == "RTX 4090" and "3.1-8B" in x[0].name]
    for row, _, flops, _, _ in by_role.get("qlora", []):
        if not pair:
            break
        from tunepilot.sizing.catalog import load_catalog

        card = load_catalog().card(row.card)
        lora_row, _, lora_flops, _, lora_u = pair[0]
        tokens = row.microbatch * row.length
        step = tokens / row.published  # seconds per step, published
        compute = flops.per_update / (card.peak_flops("bf16") * lora_u)
        share = flops.dequant_bytes / ((step - compute) * card.bandwidth_gb_s * 1e9)
        print(f"- QLoRA dequantisation: {step - compute:.3f} s per step beyond its FLOPs at the "
              f"LoRA row's {lora_u:.3f}: {flops.dequant_bytes / 1e9:.1f} GB at {share:.3f} of "
              f"the {card.name}'s bandwidth (shipped {shipped.DEQUANT_SHARE})")  # fmt: skip
    for row, _, _, _, u in by_role.get("fsdp", []):
        if lora:
            print(f"- FSDP over {row.gpus}: scaling efficiency {u / geomean(lora):.3f} "
                  f"(shipped {shipped.FSDP_EFFICIENCY_AT_8})")  # fmt: skip
    print("\n## Planned against published tokens/s (shipped constants, the plan's own code)\n")
    print("| setup | calibrates | published tokens/s | FLOPs per token (dry run) | reached "
          "utilisation | planned tokens/s | planned / published | source, notes |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for row, dry, flops, io, u in results.values():
        steady = next(p for p in dry.phases if p.phase == "steady step")
        per_token = steady.flops / (row.microbatch * row.length)
        plan = planned(row, flops, io)
        ratio = plan / row.published
        goal = " (goal 0.8-1.25)" if row.role != "held out" else ""
        mark = "" if 0.8 <= ratio <= 1.25 else " OUTSIDE"
        print(f"| {row.name} | {row.role} | {row.published:,.0f} | {per_token:.3g} | {u:.3f} | "
              f"{plan:,.0f} | {ratio:.2f}{goal}{mark} | {row.source}"
              f"{'; ' + row.note if row.note else ''} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
