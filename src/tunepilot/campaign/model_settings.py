"""The campaign's `model:` block (P1, P4): which base, pinned, and how it is adapted.

Kept apart from schema.py, which assembles the whole campaign, because these settings are
read on their own by the model loader and the sizing; importing it stays cheap (pydantic only).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tunepilot.campaign.bounds import Strict

# --------------------------------------------------------------------------------------------
# model (P1, P4)
# --------------------------------------------------------------------------------------------


class LoraSettings(Strict):
    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"],
                                      min_length=1)  # fmt: skip
    modules_to_save: list[str] = Field(default_factory=list)


class ModelSettings(Strict):
    """The base model, pinned, and how it is adapted (P1, P4)."""

    name_or_path: str = Field(
        min_length=1, description="A local folder, `minilm` (the bundled MiniLM) or a hub id."
    )
    revision: str | None = Field(
        default=None, description="Exact revision (commit) for a hub id; required for hub ids."
    )
    method: Literal["full", "lora"] = "lora"
    lora: LoraSettings = Field(default_factory=LoraSettings)
    trust_remote_code: bool = False
    attn_implementation: str | None = None
    base_dtype: Literal["fp32", "bf16", "fp16", "nf4", "int8"] | None = Field(
        default=None,
        description="Precision of the frozen base: fp32/bf16/fp16, or nf4/int8 (QLoRA, "
        "bitsandbytes, CUDA only). Unset: fp32 on CPU, bf16 on a CUDA GPU that has it. "
        "Trained weights (LoRA, modules_to_save, full fine-tuning) are in "
        "training.weights_dtype (fp32 unless set).",
    )
