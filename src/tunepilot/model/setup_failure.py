"""The error a model set-up that would train silently wrong raises (P1-P3)."""

from __future__ import annotations

from tunepilot.errors import InputError, Problem
from tunepilot.verdict import Finding


class SetupFailure(InputError):
    """A model set-up that would train silently wrong; carries the FAIL finding and its fix.

    It is bad input (the campaign's `key` asks for it), so every command reports it like any
    other: the key, what was seen and the fix, exit 2. The pilot turns it into a FAIL gate.
    """

    def __init__(self, finding: Finding, key: str = "model") -> None:
        self.finding = finding
        super().__init__(
            [Problem(key, finding.sentence,
                     finding.details.get("fix") or f"change {key} as the sentence says")],
            title="model set-up refused",
        )
