"""The parts of `training` that are sections of their own: the budget (S7) and the stop
causes decided before the trial (V4)."""

from __future__ import annotations

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
