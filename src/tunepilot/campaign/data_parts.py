"""The data settings' parts (D1-D8): cleaning rules, columns, the split policy and a Hub
dataset source. `DataSettings` itself lives in schema.py, next to the campaign that checks it
against the task; these are re-exported there."""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from tunepilot.campaign.bounds import Seed, Strict

CLEANING_RULES = (
    "nfc",
    "strip",
    "collapse_whitespace",
    "lowercase",
    "drop_empty",
    "drop_exact_duplicates",
)


def _check_cleaning_rule(rule: Any) -> str | dict[str, int]:
    """A rule is a name from CLEANING_RULES or `{max_chars: N}`; one message for both."""
    if isinstance(rule, str) and rule in CLEANING_RULES:
        return rule
    if (
        isinstance(rule, dict)
        and list(rule) == ["max_chars"]
        and isinstance(rule["max_chars"], int)
        and rule["max_chars"] >= 1
    ):
        return rule
    close = difflib.get_close_matches(str(rule), CLEANING_RULES, n=1)
    hint = f" (did you mean `{close[0]}`?)" if close else ""
    raise ValueError(
        f"unknown cleaning rule {rule!r}{hint}; use one of {', '.join(CLEANING_RULES)} "
        "or {max_chars: N} with N >= 1"
    )


CleaningRule = Annotated[Any, AfterValidator(_check_cleaning_rule)]


class Fields(Strict):
    """Which column of the user's files holds what."""

    id: str | None = Field(default=None, description="Example id column; row number if absent.")
    text: str = "text"
    image: str | None = Field(
        default=None, description="Image path column (image_classification), relative to the file."
    )
    label: str | None = Field(default=None, description="Class name column (classification).")
    target: str | None = Field(default=None, description="JSON answer column (extraction).")
    group: str | None = Field(
        default=None, description="Leakage unit: conversation, patient, source document (D8)."
    )
    time: str | None = Field(default=None, description="Timestamp column for time splits (D8).")
    context: list[str] = Field(
        default_factory=list, description="Extra input columns shown to the model."
    )


class SplitPolicy(Strict):
    """How train / validation / test are separated (D8). `files` uses the user's own files."""

    policy: Literal["random", "stratified", "group", "time", "files"] = Field(
        default="stratified",
        description="`group`: each data.fields.group whole in one split; `time`: the earliest "
        "period trains, the latest tests (whole groups, placed by when each began, when a group "
        "is declared); `files`: your own files, a missing one carved from train the same way.",
    )
    validation: float = Field(default=0.1, gt=0, lt=1)
    test: float = Field(default=0.1, ge=0, lt=1)
    seed: Seed = 0

    @model_validator(mode="after")
    def _fractions_leave_training(self) -> SplitPolicy:
        if self.validation + self.test >= 0.9:
            raise ValueError(
                f"validation ({self.validation}) + test ({self.test}) leaves under 10% for "
                "training; lower one of them"
            )
        return self


class DatasetSource(Strict):
    """A dataset read the Hub's way, through `datasets.load_dataset` and its cache (D1)."""

    name: str = Field(min_length=1, max_length=300, description="A Hub dataset id "
                      "(`org/name`) or a local dataset folder (relative to the campaign).")
    revision: str | None = Field(default=None, max_length=200, description="The dataset "
                                 "repository's commit; required for a Hub id.")
    config: str | None = Field(default=None, max_length=200, description="Its configuration.")
    split: str = Field(default="train", min_length=1, max_length=200, description="A `datasets`"
                       " split, e.g. `train` or `train[:90%]`; split.policy splits it further.")
