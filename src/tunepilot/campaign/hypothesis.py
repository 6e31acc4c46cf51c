"""The hypothesis section of a campaign (H1, H2): the behaviour to improve, stated before any
compute is spent, and the guards that say what must not degrade while it improves."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from tunepilot.campaign.bounds import Fraction, Strict

TaskKind = Literal["classification", "extraction", "format", "image_classification"]
CLASSIFICATION_TASKS = ("classification", "image_classification")


class ClassificationGuards(Strict):
    """What must not degrade in classification: judged per class, never only on the mean (H2)."""

    metric: Literal["f1", "precision", "recall"] = "f1"
    per_class_floor: float | None = Field(
        default=None, ge=0, le=1, description="Every class must reach at least this metric."
    )
    max_class_drop: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="No class may drop more than this vs the baseline (absolute metric).",
    )
    class_floors: dict[str, Fraction] = Field(
        default_factory=dict, description="Per-class floors that override per_class_floor."
    )


class ExtractionGuards(Strict):
    """What must not degrade in extraction or format tasks (H2)."""

    json_validity_min: float = Field(default=0.95, ge=0, le=1)
    schema_validity_min: float = Field(default=0.9, ge=0, le=1)
    required_field_presence_min: float = Field(default=0.9, ge=0, le=1)


PLACEHOLDER_BEHAVIOUR = "STATE THE BEHAVIOUR TO IMPROVE (H1)"
"""What `init --from-axolotl` writes where the behaviour goes: Axolotl has no hypothesis."""


class Hypothesis(Strict):
    """The behaviour to improve, stated before any compute is spent (H1)."""

    behaviour: str = Field(min_length=1, description="The behaviour to improve, in words.")
    task: TaskKind
    classification_guards: ClassificationGuards = Field(default_factory=ClassificationGuards)
    extraction_guards: ExtractionGuards = Field(default_factory=ExtractionGuards)
    required_fields: list[str] = Field(
        default_factory=list, description="Extraction: fields the JSON answer must contain."
    )
    target_schema: dict[str, Any] | None = Field(
        default=None,
        description="Extraction: a JSON Schema the answer must match (draft from `$schema`, "
        "2020-12 when absent).",
    )

    @field_validator("behaviour")
    @classmethod
    def _stated(cls, behaviour: str) -> str:
        if behaviour.strip() == PLACEHOLDER_BEHAVIOUR:
            raise ValueError("the converter's placeholder, not a hypothesis: write the behaviour "
                             "to improve in your words, e.g. \"Route each support message to the "
                             "right queue\" (H1)")  # fmt: skip
        return behaviour

    @field_validator("target_schema")
    @classmethod
    def _valid_json_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        """The schema itself is checked against its draft now, not when an evaluation meets it."""
        if schema is not None:
            from tunepilot.campaign.answer_schema import schema_problem

            problem = schema_problem(schema)
            if problem:
                raise ValueError(f"not a valid JSON Schema {problem}")
        return schema

    @property
    def is_classification(self) -> bool:
        """One label per example (text or image): the same head, loss, metrics and guards."""
        return self.task in CLASSIFICATION_TASKS
