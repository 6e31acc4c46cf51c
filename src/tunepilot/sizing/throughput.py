"""How much of a card's dense peak a fine-tuning step reaches: a model calibrated on published
measurements (L3), used until a pilot on the card measures the step itself.

The dry run counts the FLOPs the step executes (the recomputed forward of activation
checkpointing included). Dividing published tokens per second by them gives the share of the
datasheet's dense peak that those steps reached ("utilisation" below: executed FLOPs, so a
checkpointed step is not penalised twice). `benchmarks/bench_published_throughput.py` sizes
each published setup with the dry run, derives these figures and prints planned over
published tokens/s for every row, held-out rows included; the constants here are what it
printed (docs/sizing-validation.md keeps the table).

- **LoRA** (`expected` = geometric mean, `low`/`high` = the extremes) from three single-GPU
  rows: torchtune's Llama-2-7B on an RTX 4090 (May 2024), Llama-3.1-8B on an RTX 4090
  (Sep 2024) and Llama-3.2-3B r64 on an A100 80GB (Nov 2024).
- **Full fine-tuning** from one row (torchtune, Llama-3.2-3B full bf16 on an A100 80GB, packed
  to 4096): its low/high carry the LoRA rows' relative spread.
- **QLoRA** is LoRA plus the dequantisation of every quantized weight in each pass (forward,
  backward, recompute): the nf4 codes read and the bf16 weight written, at `DEQUANT_SHARE` of
  the card's bandwidth. That share is what QLoRA adds over LoRA in the same publication on the
  same card (Llama-3.1-8B on an RTX 4090: 2,413 vs 3,083 tokens/s), the FLOPs of its extra
  LoRA modules taken out.
- **Several GPUs in one run** (DDP/FSDP over N): N x the single-GPU rate x a scaling efficiency
  calibrated on one row (torchtune, Llama-3.1-70B LoRA with FSDP over 8 A100 80GB:
  3,497 tokens/s for the machine), taken to lose the same share per extra GPU for other N.
- fp32, tf32 and fp16 have no published row here: they use the bf16 figure of their method,
  labelled "not calibrated".

Every figure is labelled where it is used; a pilot on the card that measured the steady step
on a quiet machine replaces all of them (`timing.seconds_on`).
"""

from __future__ import annotations

from dataclasses import dataclass

DEQUANT_SHARE = 0.206
"""Share of the card's memory bandwidth bitsandbytes' dequantisation reaches (nf4 read, bf16
written), calibrated on the QLoRA/LoRA pair above."""
FSDP_EFFICIENCY_AT_8 = 0.787
"""Machine tokens/s over 8 x the single-GPU rate for one FSDP run over 8 A100s, calibrated."""
CALIBRATION_GPUS = 8


@dataclass(frozen=True)
class Utilisation:
    """Share of the dense peak the executed FLOPs reach: expected, and the range seen."""

    expected: float
    low: float
    high: float
    basis: str

    def spread(self) -> tuple[float, float]:
        """(fast, slow) time factors against the expected time: expected/high, expected/low."""
        return self.expected / self.high, self.expected / self.low


_LORA_ROWS = "three published single-GPU LoRA rows (torchtune: Llama-2-7B and Llama-3.1-8B on " \
    "an RTX 4090, Llama-3.2-3B on an A100 80GB)"  # fmt: skip
LORA = Utilisation(0.715, 0.646, 0.841, f"calibrated on {_LORA_ROWS}")
FULL = Utilisation(
    0.549, 0.549 * LORA.low / LORA.expected, 0.549 * LORA.high / LORA.expected,
    "calibrated on one published row (torchtune: Llama-3.2-3B full fine-tuning on an A100 "
    "80GB); the range is the LoRA rows' relative spread",
)  # fmt: skip
CALIBRATED = {"lora": LORA, "qlora": LORA, "full": FULL}
CALIBRATED_PRECISIONS = ("bf16",)


def method_of(dry: object) -> str:
    """"full", "qlora" (LoRA on a quantized base) or "lora", from a dry run."""
    if dry.trainable_params >= dry.total_params:  # type: ignore[attr-defined]
        return "full"
    steady = next(p for p in dry.phases if p.phase == "steady step")  # type: ignore[attr-defined]
    return "qlora" if steady.inputs.get("base_dtype") in ("nf4", "int8") else "lora"


def utilisation(method: str, precision: str) -> Utilisation:
    """The calibrated utilisation of `method` computing mostly in `precision`."""
    found = CALIBRATED[method]
    if precision in CALIBRATED_PRECISIONS:
        return found
    return Utilisation(found.expected, found.low, found.high,
                       f"the {method} bf16 figure, NOT calibrated for {precision} (no published "
                       f"{precision} row); {found.basis}")  # fmt: skip


def dequant_seconds(dequant_bytes: float, bandwidth_gb_s: float) -> float:
    """Seconds QLoRA's dequantisation adds to an update that moves `dequant_bytes`."""
    return dequant_bytes / (bandwidth_gb_s * 1e9 * DEQUANT_SHARE)


def scaling_efficiency(gpus: int) -> float:
    """Machine rate over `gpus` x the single-GPU rate for one run over `gpus` GPUs: the
    calibrated loss at 8, the same share lost per extra GPU elsewhere (an assumption for
    N != 8, and for DDP, which has no published row here)."""
    if gpus <= 1:
        return 1.0
    lost_per_peer = (1.0 - FSDP_EFFICIENCY_AT_8) / (CALIBRATION_GPUS - 1)
    return max(0.1, 1.0 - lost_per_peer * (gpus - 1))


def scaling_sentence(kind: str, gpus: int) -> str:
    """Where a layout's scaling efficiency comes from, in words."""
    e = scaling_efficiency(gpus)
    where = ("calibrated on torchtune's Llama-3.1-70B LoRA, FSDP over 8 A100 80GB"
             if gpus == CALIBRATION_GPUS and kind == "fsdp"
             else f"the loss per GPU calibrated for FSDP over {CALIBRATION_GPUS} A100s, "
             f"an ASSUMPTION for {kind.upper()} over {gpus}")  # fmt: skip
    return f"scaling efficiency {e:.0%} ({where})"
