"""The campaign file (H1, H2): schema (schema.py) and reading with collected errors (loading.py).

Importing this package must stay cheap: no torch, no transformers.
"""

from tunepilot.campaign.hypothesis import ClassificationGuards, ExtractionGuards, Hypothesis
from tunepilot.campaign.loading import (
    apply_overrides,
    campaign_root,
    json_schema,
    load_campaign,
    parse_override,
    validate_mapping,
)
from tunepilot.campaign.schema import (
    CLASSIFICATION_TASKS,
    Budget,
    Campaign,
    ChatSettings,
    DataSettings,
    Distributed,
    Fields,
    LoraSettings,
    ModelSettings,
    Rental,
    SplitPolicy,
    StopCauses,
    TrainingSettings,
    Variant,
    stable_hash,
)

__all__ = [
    "CLASSIFICATION_TASKS",
    "Budget",
    "Campaign",
    "ChatSettings",
    "ClassificationGuards",
    "DataSettings",
    "Distributed",
    "ExtractionGuards",
    "Fields",
    "Hypothesis",
    "LoraSettings",
    "ModelSettings",
    "Rental",
    "SplitPolicy",
    "StopCauses",
    "TrainingSettings",
    "Variant",
    "apply_overrides",
    "campaign_root",
    "json_schema",
    "load_campaign",
    "parse_override",
    "stable_hash",
    "validate_mapping",
]
