"""PASS / WARN / FAIL with one sentence: the shape every check in tunepilot ends in.

A FAIL stops the pilot's recommendation and makes the command exit 1; it is never silent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass
class Finding:
    """The result of one check: what was seen and what to do, with example ids."""

    check: str
    verdict: Verdict
    sentence: str
    requirement: str = ""  # SPEC ids, e.g. "D2" or "D8, S6"
    examples: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = str(self.verdict)
        return out


def worst(findings: list[Finding]) -> Verdict:
    """The overall verdict of a list of findings (FAIL beats WARN beats PASS)."""
    verdicts = {f.verdict for f in findings}
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    if Verdict.WARN in verdicts:
        return Verdict.WARN
    return Verdict.PASS


def exit_code(findings: list[Finding]) -> int:
    """0 when every check passed or warned, 1 when one failed."""
    return 1 if worst(findings) is Verdict.FAIL else 0
