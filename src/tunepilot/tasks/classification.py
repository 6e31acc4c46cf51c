"""Sequence classification: text (+ context) -> one class id (D3, D6).

The label mapping is built once, from `label_names` in order, and every consumer (training
targets, the model head's id2label, evaluation, `data show`) reads it from here: a second,
independently built mapping is how "label 3" silently becomes another class (D6). The
tokenizer is called with its own special tokens so a BERT-style model sees the [CLS]/[SEP] it
was pretrained with.
"""

from __future__ import annotations

import json
from typing import Any

from tunepilot.campaign import stable_hash
from tunepilot.errors import InputError, Problem
from tunepilot.tasks.base import Encoded
from tunepilot.tasks.example import Example


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """What identifies a tokenizer for the data version (D1): name, class, size, vocab hash.

    The path alone is not enough (a temporary folder, a re-trained tokenizer at the same path);
    the hash of the full vocabulary, added tokens included, is.
    """
    vocab = tokenizer.get_vocab()
    return {
        "name_or_path": str(getattr(tokenizer, "name_or_path", "")),
        "class": type(tokenizer).__name__,
        "vocab_size": len(vocab),
        "vocab_hash": stable_hash(vocab),
    }


def _value_text(value: Any) -> str:
    """Context values as the model reads them: strings verbatim, the rest as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class ClassificationEncoder:
    """Encode examples for a sequence-classification head with one fixed label mapping (D6)."""

    kind = "classification"

    def __init__(
        self,
        tokenizer: Any,
        label_names: list[str],
        max_length: int,
        context_fields: list[str] | None = None,
    ) -> None:
        self._set_labels(label_names)
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.context_fields = list(context_fields or [])
        self._identity = tokenizer_identity(tokenizer)

    def _set_labels(self, label_names: list[str]) -> None:
        """The one label mapping (D6): names in id order, each once."""
        problems = []
        if not label_names:
            problems.append(
                Problem("data.labels", "no class names", "list the classes in `data.labels`")
            )
        dupes = sorted({n for n in label_names if label_names.count(n) > 1})
        if dupes:
            problems.append(
                Problem(
                    "data.labels",
                    f"class name(s) listed twice: {dupes}",
                    "give each class once, in id order",
                )
            )
        if problems:
            raise InputError(problems, title="invalid label mapping")
        self.label_names = list(label_names)
        self.label2id: dict[str, int] = {name: i for i, name in enumerate(self.label_names)}
        self.id2label: dict[int, str] = dict(enumerate(self.label_names))

    def segments(self, example: Example) -> tuple[str, str | None]:
        """The text, and the context fields as a second segment ("field: value" lines)."""
        if not self.context_fields:
            return example.text, None
        missing = [f for f in self.context_fields if f not in example.context]
        if missing:
            raise InputError(
                [
                    Problem(
                        example.source,
                        f"example {example.id} has no context field(s) {missing}",
                        "add the column to every row or remove it from data.fields.context",
                    )
                ],
                title="missing context",
            )
        lines = [f"{f}: {_value_text(example.context[f])}" for f in self.context_fields]
        return example.text, "\n".join(lines)

    def label_id(self, example: Example) -> int:
        """The class id of an example; an unknown or missing label names the row and the classes."""
        if example.label not in self.label2id:
            shown = ", ".join(self.label_names[:20]) + (
                " ..." if len(self.label_names) > 20 else ""
            )
            raise InputError(
                [
                    Problem(
                        example.source,
                        f"example {example.id} has label {example.label!r}, not a known class",
                        f"use one of: {shown} (or add it to data.labels)",
                    )
                ],
                title="unknown label",
            )
        return self.label2id[example.label]  # type: ignore[index]

    def encode(self, example: Example) -> Encoded:
        """input_ids with the tokenizer's special tokens; labels = [class id]: loss on the label."""
        label = self.label_id(example)
        text, pair = self.segments(example)
        full = self.tokenizer(text, pair, add_special_tokens=True, verbose=False)["input_ids"]
        if len(full) > self.max_length:
            ids = self.tokenizer(
                text,
                pair,
                add_special_tokens=True,
                truncation=True,
                max_length=self.max_length,
            )["input_ids"]
        else:
            ids = full
        return Encoded(
            example_id=example.id,
            input_ids=list(ids),
            labels=[label],
            prompt_length=len(ids),
            truncated=len(full) > len(ids),
            target_truncated=False,
            full_length=len(full),
        )

    def expected_target(self, example: Example) -> str:
        return f"{example.label} (id {self.label_id(example)})"

    def training_view(self) -> ClassificationEncoder:
        return self

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "tokenizer": self._identity,
            "max_length": self.max_length,
            "labels": self.label_names,
            "context_fields": self.context_fields,
        }
