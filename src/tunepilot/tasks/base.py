"""The contract between data and training: one encoding path, shared by `data show`, the
audit's truncation check, training and evaluation (D3, D5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from tunepilot.tasks.example import Example

IGNORE_INDEX = -100
"""Label value for token positions that carry no loss (the PyTorch / transformers convention)."""


@dataclass
class Encoded:
    """One example as the model sees it.

    `labels` is per token for causal LMs (IGNORE_INDEX where no loss), and a one-element list
    holding the class id for sequence classification. `prompt_length` is the number of leading
    tokens that belong to the prompt; `target_truncated` says max_length cut answer tokens (S6).
    An image example has no tokens: `pixel_values` holds the processed (channels, height, width)
    tensor and `input_ids` stays empty.
    For a conversation, `cut_turns` numbers (from 1) the assistant turns carrying loss that
    max_length cut, so the audit can report truncation turn by turn.
    """

    example_id: str
    input_ids: list[int]
    labels: list[int]
    prompt_length: int
    truncated: bool
    target_truncated: bool
    full_length: int
    pixel_values: Any = None
    cut_turns: list[int] = field(default_factory=list)

    @property
    def loss_tokens(self) -> int:
        """Positions that carry loss: target tokens (LM) or 1 (classification)."""
        return sum(1 for t in self.labels if t != IGNORE_INDEX)


class TaskEncoder(Protocol):
    """What every task kind provides. Implementations live in classification.py and
    generation.py; `tunepilot.tasks.make_encoder` picks one from the campaign."""

    kind: str  # "classification" | "causal_lm"

    def encode(self, example: Example) -> Encoded: ...

    def expected_target(self, example: Example) -> str: ...

    def describe(self) -> dict[str, Any]:
        """Identity of the encoding (tokenizer, max_length, template) for the data version."""
        ...

    def training_view(self) -> TaskEncoder:
        """The encoder for the training split: itself, or with training-only augmentation."""
        ...
