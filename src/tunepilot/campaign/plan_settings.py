"""The campaign's plan around the training (V1-V7, H4, L3): its variants, the sealed test's
policy and the rental.

Kept apart from schema.py, which assembles the whole campaign: each block is validated on its
own and read by its own stage (compare, the sealed test, the rental plan).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tunepilot.campaign.bounds import Strict

# --------------------------------------------------------------------------------------------
# variants, evaluation policy, rental (V1-V7, H4, L3)
# --------------------------------------------------------------------------------------------


class Variant(Strict):
    """One explainable change against its control (V1)."""

    explain: str = Field(min_length=1)
    overrides: dict[str, Any] = Field(default_factory=dict)
    control: Literal["control"] = Field(
        default="control",
        description="What the variant is compared with: always the campaign itself (`control`).",
    )
    allow_multi_change: bool = False
    reason: str | None = None

    @field_validator("control", mode="before")
    @classmethod
    def _only_the_campaign(cls, value: Any) -> Any:
        """Every variant is trained from the campaign and compared with its control runs; a
        control naming another variant would be accepted and ignored, so it is refused."""
        if value != "control":
            raise ValueError(
                f"`{value}`: every variant is compared with the campaign itself, `control`; to "
                "build on another variant, copy its overrides into this one (with "
                "allow_multi_change and a reason), or leave `control` out"
            )
        return value

    @model_validator(mode="after")
    def _multi_change_needs_reason(self) -> Variant:
        if self.allow_multi_change and not self.reason:
            raise ValueError("allow_multi_change needs a `reason`")
        return self


class TestPolicy(Strict):
    """The sealed test split (H4): every look is counted; a second one warns or is refused."""

    on_second_look: Literal["warn", "refuse"] = "warn"


class Rental(Strict):
    gpu: str | None = Field(default=None, description="Card name from the GPU catalog.")
    gpus: int = Field(default=1, ge=1)
    margin: float = Field(default=0.2, ge=0, lt=1)
    packages_days: list[Literal[3, 7, 30]] = Field(default_factory=lambda: [3, 7, 30])
