"""The one record type every data step passes along."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class Example:
    """One example as loaded from the user's files, after cleaning.

    `source` is "file:line" so any later finding can point back at the row that caused it.
    `target` is the JSON answer for extraction/format tasks; `label` the class name for
    classification. `context` holds extra input columns (e.g. requested slots). A conversation
    (`data.chat`) keeps its turns in `messages` ({role: system|user|assistant, content}); its
    `text` is then the user and system turns (what duplicate searches compare) and its
    `target` the last assistant turn (what evaluation scores).
    """

    id: str
    text: str
    source: str
    label: str | None = None
    target: Any = None
    group: str | None = None
    time: str | None = None
    context: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, str]] | None = None

    def content(self) -> dict[str, Any]:
        """What the data version hashes: everything that can change what the model sees."""
        out = {
            "id": self.id,
            "text": self.text,
            "label": self.label,
            "target": self.target,
            "group": self.group,
            "time": self.time,
            "context": self.context,
        }
        if self.messages is not None:  # absent for text rows: their versions stay as they were
            out["messages"] = self.messages
        return out


Splits = dict[str, list[Example]]
"""train / validation / test -> examples, in a deterministic order."""
