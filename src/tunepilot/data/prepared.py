"""What the data pipeline hands to everything downstream (audit, encoding, training)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunepilot.tasks.example import Splits


@dataclass
class RuleCount:
    """How one cleaning rule changed the data (D1): reported in the audit."""

    rule: str
    changed: int = 0
    dropped: int = 0
    example_ids: list[str] = field(default_factory=list)
    # drop_exact_duplicates only: dropped copies whose label or answer differs from the copy
    # kept ({kept, kept_answer, dropped, dropped_answer, source}); the audit reports them
    conflicts: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class PreparedData:
    """Loaded, cleaned, split and versioned examples.

    `version` is the D1 content hash (examples + cleaning rules + split policy + encoding
    settings); the ids per split are written to `folder/splits.json` so any run can say exactly
    what it saw. `label_names` is in id order (classification), empty otherwise.
    """

    splits: Splits
    version: str
    label_names: list[str]
    cleaning: list[RuleCount]
    split_policy: dict[str, Any]
    folder: Path | None = None
    test_seal: dict[str, Any] | None = None
    generic: Any = None  # data.generic.GenericTexts counted before cleaning dropped copies
