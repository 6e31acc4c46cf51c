"""The data audit's thresholds (D2, D3, D6, S6): where a finding turns from PASS to WARN or
FAIL, set per campaign because what is normal depends on the data (a share of near copies, of
cut texts, of rows that name their class). Importing this module stays cheap.
"""

from __future__ import annotations

from pydantic import Field

from tunepilot.campaign.bounds import Strict


class AuditSettings(Strict):
    near_duplicate_threshold: float = Field(default=0.8, gt=0, le=1)
    shingle_size: int = Field(default=3, ge=1, description="Words per shingle for MinHash.")
    truncation_warn_share: float = Field(default=0.02, ge=0, le=1)
    imbalance_warn_ratio: float = Field(
        default=20.0, ge=1, description="WARN when the largest class exceeds the smallest by this."
    )
    target_leak_share: float = Field(
        default=0.1, ge=0, le=1,
        description="FAIL when more than this share of a split's rows carry their answer in "
        "the input (the class name in the text, the answer in the prompt or an earlier turn); "
        "raise it for a task whose answer rewrites the input.",
    )  # fmt: skip
