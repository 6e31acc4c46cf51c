"""A hand-made dry run of an 8B-shaped LoRA step whose bytes and FLOPs are known exactly, for
the tests of the per-card sheet and the plan (the real dry run is tested in test_dry_run.py).

Imported by tests (pytest puts this folder on sys.path).
"""

from __future__ import annotations

from pathlib import Path

from tunepilot.sizing.dry_run.run import DryRun, PhaseSize
from tunepilot.sizing.sheet import Setting

GIB = 2**30
PARAMS, TRAINABLE, LAYERS, LENGTH = 8_000_000_000, 20_000_000, 32, 2048
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "nf4": 0.55}
PER_EXAMPLE = {False: 3 * GIB, True: GIB // 2}  # activations per example at LENGTH
CONTEXT = 512 * 2**20
EVAL_BATCH = 8  # the evaluation batch when the setting does not name one


def fake_dry_run(s: Setting) -> DryRun:
    """Bytes: weights by base dtype, fp32 LoRA gradients and AdamW state, activations linear in
    the microbatch (doubled in fp32), an evaluation of GIB per 8 examples of its batch. FLOPs:
    6 x params x tokens, 8 with checkpointing (the recomputed forward), all in bf16 when the
    base or the autocast is bf16 (what a T4 cannot run), else in fp32."""
    weights = int(PARAMS * WEIGHT_BYTES[s.base_dtype])
    act = s.microbatch * PER_EXAMPLE[s.checkpointing] * (2 if s.precision == "fp32" else 1)
    tokens = s.microbatch * LENGTH
    step_flops = (8 if s.checkpointing else 6) * PARAMS * tokens
    computes = "bf16" if "bf16" in (s.precision, s.base_dtype) or s.base_dtype == "nf4" else "fp32"
    inputs = {"microbatch": s.microbatch, "length": LENGTH, "base_dtype": s.base_dtype,
              "activation_checkpointing": s.checkpointing}  # fmt: skip
    eval_acts = (s.eval_batch or EVAL_BATCH) * GIB // EVAL_BATCH

    def phase(name: str, grads: int, opt: int, acts: int, temp: int, flops: int) -> PhaseSize:
        return PhaseSize(name, weights, grads, opt, acts, temp, weights + grads + opt + acts + temp,
                         flops, dict(inputs), [], flops_by={computes: flops} if flops else {})

    g, o = 4 * TRAINABLE, 8 * TRAINABLE
    phases = [
        phase("first step", g, o, act, GIB // 4, step_flops),
        phase("steady step", g, o, act, GIB // 5, step_flops),
        phase("evaluation", 0, o, eval_acts, 0, 2 * PARAMS * 32 * LENGTH),
        phase("checkpoint", g, o, 0, 0, 0),
        phase("export", 0, o, 0, 0, 0),
    ]
    return DryRun("llama-3-8b-config", "LlamaForCausalLM", LAYERS, (1, 2), TRAINABLE, PARAMS,
                  phases, cuda_context_bytes=CONTEXT)  # fmt: skip


SMALL = {"data.fields.time": None, "data.max_length": 64, "model.method": "lora",
         "training.microbatch": 2, "training.eval_batch_size": 4}  # fmt: skip
"""The tiny extraction demo at a small shape: what the real dry-run tests size."""


def tiny_llama_campaign(folder: Path) -> Path:
    """The tiny extraction demo: a real 2-block Llama base (fp32 weights) and its tokenizer."""
    from tunepilot.demo.campaign import write_demo_campaign

    return write_demo_campaign(folder, "extraction", tiny=True, n_conversations=40,
                               overrides=SMALL)  # fmt: skip
