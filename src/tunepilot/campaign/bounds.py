"""The rules every value of a campaign file is held to, once (STYLE: defaults and bounds live
in the schema): unknown keys are errors, numbers are finite, names that become folder names
cannot leave the campaign folder, seeds are ones every generator accepts.

Every section of the schema derives from `Strict`; the types below are shared by the sections
and by the command line (`--seeds` follows `Seeds`).
"""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationInfo,
    field_validator,
)


class Strict(BaseModel):
    """Base for every campaign section: unknown keys are errors, values are validated on set,
    no float is infinite or NaN (`.inf` is never a setting), and no number is a yes/no value
    (YAML reads `yes`, `on` and `true` as booleans, which pydantic would take as 1)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _number_only(field.annotation):
            return _no_bool(value)
        return value


def _number_only(annotation: Any) -> bool:
    """An int or float setting (optional or not) that takes no boolean."""
    options = set(get_args(annotation)) if get_origin(annotation) in (Union, UnionType) else {
        annotation}  # fmt: skip
    return bool(options & {int, float}) and bool not in options


# Names that become folder or file names (campaign, variants, and so run ids): one rule for all,
# so no name can climb out of the campaign folder (`../../etc`) or hide as a dot-file.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
Name = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        pattern=NAME_PATTERN,
        description="Letters, digits, `.`, `_`, `-`; starts with a letter or digit (it names "
        "folders).",
    ),
]
def _no_bool(value: object) -> object:
    """YAML reads `yes`, `on` and `true` as booleans, which pass as 1 where an int is due."""
    if isinstance(value, bool):
        raise ValueError(f"`{str(value).lower()}` is a yes/no value, not a number")
    return value


# A seed every generator accepts as is (NumPy's legacy seeding stops at 2**32 - 1).
MAX_SEED = 2**32 - 1
Seed = Annotated[int, BeforeValidator(_no_bool), Field(ge=0, le=MAX_SEED)]
Fraction = Annotated[float, Field(ge=0, le=1)]


def _seeds_once(seeds: list[int]) -> list[int]:
    """A seed listed twice would train the same run twice and count it twice (V6)."""
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{seeds} lists a seed twice; list each seed once")
    return seeds


# The seeds every variant runs: the campaign's `seeds` and `--seeds` share this one rule.
Seeds = Annotated[list[Seed], Field(min_length=1), AfterValidator(_seeds_once)]
SEEDS = TypeAdapter(Seeds)
