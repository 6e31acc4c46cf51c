"""The parts of `training` that are sections of their own: the budget (S7), the stop causes
decided before the trial (V4) and the causal-LM loss's settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tunepilot.campaign.bounds import Strict


class Budget(Strict):
    """Hold updates or epochs fixed; the other follows and is recorded (S7)."""

    updates: int | None = Field(default=None, ge=1, le=10**8)
    epochs: float | None = Field(default=None, gt=0, le=10_000)

    @model_validator(mode="after")
    def _exactly_one(self) -> Budget:
        if (self.updates is None) == (self.epochs is None):
            raise ValueError(
                "set exactly one of `updates` or `epochs` (to switch, set the other to null)"
            )
        return self


class StopCauses(Strict):
    """Defined before the trial (V4): what ends a run other than its budget."""

    max_loss: float | None = Field(default=None, gt=0, description="Stop when loss exceeds.")
    wall_clock_minutes: float | None = Field(default=None, gt=0)


class LossSettings(Strict):
    """How a causal LM's loss is computed (`train.loss`); the rest of `training` derives from
    this section so its keys stay `training.loss_chunks` and `training.loss_kernel`."""

    loss_chunks: int = Field(
        default=8, ge=1, le=2**16,
        description="Pieces the loss positions of a causal-LM microbatch are cut into: each "
        "piece's head and cross-entropy run in fp32 on their own and are recomputed in "
        "backward, so no (tokens x vocabulary) tensor of the microbatch exists.",
    )  # fmt: skip
    loss_kernel: Literal["plain", "liger", "cut_cross_entropy"] = Field(
        default="plain",
        description="plain (tunepilot's chunked loss, everywhere), liger (liger-kernel's "
        "fused linear cross-entropy) or cut_cross_entropy: a library is used on CUDA only, "
        "must be installed, and needs a head without LoRA; which one ran is in env.json.",
    )
