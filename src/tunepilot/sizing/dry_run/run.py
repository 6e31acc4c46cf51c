"""The dry run (S1, S3, S5): the campaign's exact step on the target architecture, without a GPU.

"Before you pay, know what the campaign needs." The target's config.json alone (a shipped
config, or a folder with config.json; weights are never read) builds the model on meta tensors
through the code a run uses: `model.build` (base dtype, LoRA targets, modules_to_save, the set-up
checks), activation checkpointing as the loop enables it, AdamW from `train.optimizer`, the
loss from `train.batching`. The phases the pilot measures then execute on meta tensors:
first step (optimizer state allocated), steady step, evaluation at the longest validation
length, checkpoint and export. Meta tensors hold no memory, so a 70B step runs on a laptop.

How the bytes are known (`dry_run.tracker`): every storage an operator returns is counted
while it lives, so each phase's peak is the true peak of live bytes, split into weights,
gradients, optimizer state, activations (made by forward, kept for backward) and temporaries.
FLOPs come from `torch.utils.flop_counter.FlopCounterMode` on the same run.

Extrapolation. Decoder stacks repeat one block, and executing many blocks op by op costs
minutes (391 s for 32 Llama-3-8B blocks). Each phase is measured on the model with 2 and with
3 blocks (1 and 2 for a 2-block model); every component then follows
`total = m2 + (L - 2) * (m3 - m2)`: the embedding, the head and the loss are in both, each
extra block adds `m3 - m2`. Weights, gradients, optimizer state and FLOPs repeat exactly; the
peak moment inside backward can move by a few tensors with depth (within 1% in the tests).

Measured vs added analytically (each added term is named in the phase's `analytical`):
- attention runs as the target backend does (`dry_run.attention`): fused SDPA / flash keep no
  L x L matrix, eager does; stated per phase;
- checkpoint and export write safetensors from host copies: no device allocation beyond what
  is resident, so those phases are the resident bytes (plus export's control forward);
- nf4/int8 bases: the meta run computes in bf16; quantized weights are counted at their
  bitsandbytes storage size, the other frozen tensors in fp32 (peft's
  prepare_model_for_kbit_training), and one dequantized weight is a temporary;
- generation at evaluation: the prefill's KV cache is measured, its growth over
  max_new_tokens is added;
- CUDA's own terms: the cuBLAS workspace (in the allocator) is added to every phase; the CUDA
  context (outside the allocator) and the caching allocator's reserved-but-free blocks are
  reported apart, never hidden in a phase.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tunepilot.sizing.dry_run.config import architecture_config
from tunepilot.sizing.phase_size import (  # noqa: F401  (PHASES: part of the interface)
    CUDA_CONTEXT,
    MIB,
    PHASES,
    PhaseSize,
)

if TYPE_CHECKING:
    from tunepilot.data.workspace import Workspace

@dataclass
class DryRun:
    """The dry run of one campaign shape: every phase, and how it was obtained."""

    model: str
    architecture: str
    layers: int
    blocks_measured: tuple[int, int]
    trainable_params: int
    total_params: int
    phases: list[PhaseSize]
    notes: list[str] = field(default_factory=list)
    source: str = ""
    cuda_context_bytes: int = CUDA_CONTEXT  # outside the allocator: an assumption, labelled
    seconds: float = 0.0
    generated_tokens: int = 0  # new tokens evaluation generates per example (0: it does not)
    quantized_params: int = 0  # frozen weights stored in nf4/int8 (each pass dequantizes them)
    mean_length: float | None = None  # mean padded tokens per training example (the data's)
    mean_eval_length: float | None = None  # mean tokens per validation example (the data's)
    lengths_source: str | None = None  # which tokenizer measured the data; None: max_length

    def peak(self) -> PhaseSize:
        """The phase with the highest peak."""
        return max(self.phases, key=lambda p: p.peak)

    def phase(self, name: str) -> PhaseSize:
        return next(p for p in self.phases if p.phase == name)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["blocks_measured"] = list(self.blocks_measured)
        out["peak_phase"] = self.peak().phase
        return out


def dry_run(
    ws: Workspace,
    *,
    microbatch: int | None = None,
    max_length: int | None = None,
    activation_checkpointing: bool | None = None,
    base_dtype: str | None = None,
    attention: str | None = None,
    device: str = "cuda",
) -> DryRun:
    """Size the campaign's phases on its target architecture; None = the campaign's setting.

    `device` is the kind of device sized: "cuda" (the rented GPU; fused attention kernels,
    cuBLAS workspace) or "cpu" (this machine, used to validate against real execution).
    """
    from tunepilot.progress import Progress
    from tunepilot.sizing.dry_run.measure import measure_blocks
    from tunepilot.sizing.dry_run.shape import Shape

    started = time.monotonic()
    campaign = ws.campaign
    arch = architecture_config(campaign.model, ws.root)
    shape = Shape.from_campaign(
        ws, arch, microbatch=microbatch, max_length=max_length,
        activation_checkpointing=activation_checkpointing, base_dtype=base_dtype,
        attention=attention, device=device,
    )  # fmt: skip
    layers = arch.layers
    blocks = measured_blocks(layers)
    what = (f"dry run: microbatch {shape.microbatch} x {shape.length}, {shape.base_dtype} base"
            f"{', checkpointing' if shape.activation_checkpointing else ''}")  # fmt: skip
    # a dry run of a large model takes seconds to minutes: never a silent command
    with Progress(what, total=2, unit="models", heartbeat=True) as bar:
        m1 = measure_blocks(arch, shape, blocks[0])
        bar.advance(1, note=f"{blocks[0]} of {layers} blocks")
        m2 = measure_blocks(arch, shape, blocks[1]) if blocks[1] != blocks[0] else m1
        bar.advance(2, note=f"{blocks[1]} of {layers} blocks")
    a = blocks[0]
    phases = [_combine(m1.phases, m2.phases, p, layers - a) for p in PHASES]
    notes = [
        f"measured on the model with {a} and {blocks[1]} of its {layers} blocks on meta "
        f"tensors, extrapolated per component: total = m{a} + ({layers} - {a}) x "
        f"(m{blocks[1]} - m{a}); no weights were read",
        *shape.notes,
    ]
    if device == "cuda":
        notes.append(
            f"not in any phase: the CUDA context (~{CUDA_CONTEXT // MIB} MiB, an assumption) "
            "and the caching allocator's reserved-but-free blocks (measured on the GPU only)"
        )
    built = m1.built
    if built != arch.architecture:
        notes.insert(1, f"built as {built} (hypothesis.task {campaign.hypothesis.task}) from a "
                        f"{arch.architecture} config.json")  # fmt: skip
    return DryRun(
        model=campaign.model.name_or_path,
        architecture=built,
        layers=layers,
        blocks_measured=blocks,
        trainable_params=_line(m1.trainable, m2.trainable, layers - a),
        total_params=_line(m1.total, m2.total, layers - a),
        phases=phases,
        notes=notes,
        source=arch.source,
        seconds=round(time.monotonic() - started, 2),
        generated_tokens=campaign.training.max_new_tokens
        if shape.generates else 0,
        quantized_params=_line(m1.quantized, m2.quantized, layers - a),
        mean_length=shape.lengths.mean_train if shape.lengths else None,
        mean_eval_length=shape.lengths.mean_eval if shape.lengths else None,
        lengths_source=shape.lengths.source if shape.lengths else None,
    )


def measured_blocks(layers: int) -> tuple[int, int]:
    """The two depths measured: 2 and 3 blocks where the model has them. The first block is
    no model of the others (with one block the peak can fall at another moment), so the
    difference is taken between two blocks and three."""
    if layers >= 3:
        return 2, 3
    return (1, 2) if layers == 2 else (1, 1)


def _line(m_a: int, m_b: int, more: int) -> int:
    """`more` blocks beyond the smaller measured model, each adding m_b - m_a."""
    return m_a + more * (m_b - m_a)


def _combine(p1: dict[str, PhaseSize], p2: dict[str, PhaseSize], name: str,
             more: int) -> PhaseSize:  # fmt: skip
    """The phase `name` at full depth: each of its passes ("evaluation:loss", ...)
    extrapolated, the one with the larger peak kept, the FLOPs of all of them."""
    keys = [k for k in p1 if k == name or k.startswith(f"{name}:")]
    sized = [_extrapolate(p1[k], p2[k], more) for k in keys]
    best = max(sized, key=lambda p: p.peak)
    best.flops = sum(p.flops for p in sized)
    best.flops_by = {k: sum(p.flops_by.get(k, 0) for p in sized)
                     for k in sorted({k for p in sized for k in p.flops_by})}  # fmt: skip
    best.phase = name
    return best


def _extrapolate(p1: PhaseSize, p2: PhaseSize, more: int) -> PhaseSize:
    """Per component: m_a + more x (m_b - m_a); the peak is the sum at the same moment."""
    parts = {
        c: _line(getattr(p1, c), getattr(p2, c), more)
        for c in ("weights", "gradients", "optimizer", "activations", "temporaries", "flops")
    }
    analytical = {
        k: _line(p1.analytical.get(k, 0), p2.analytical.get(k, 0), more)
        for k in {**p1.analytical, **p2.analytical}
    }
    flops_by = {k: _line(p1.flops_by.get(k, 0), p2.flops_by.get(k, 0), more)
                for k in sorted({**p1.flops_by, **p2.flops_by})}  # fmt: skip
    peak = sum(v for k, v in parts.items() if k != "flops")
    return PhaseSize(p1.phase, **parts, peak=peak, inputs=p1.inputs, notes=p1.notes,
                     analytical=analytical, flops_by=flops_by)  # fmt: skip
