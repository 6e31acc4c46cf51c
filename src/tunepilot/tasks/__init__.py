"""Task encoders: one file per task kind behind the small `TaskEncoder` protocol (base.py).

`make_encoder` is the one place that turns a campaign into an encoder, so `data show`, the
audit's truncation check, training and evaluation all encode the same way (D3, D5, D6).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunepilot.campaign import Campaign
from tunepilot.errors import InputError, Problem
from tunepilot.tasks.base import TaskEncoder
from tunepilot.tasks.chat import ChatEncoder
from tunepilot.tasks.classification import ClassificationEncoder
from tunepilot.tasks.generation import GenerationEncoder


def make_encoder(
    campaign: Campaign, tokenizer: Any, label_names: list[str], root: Path | None = None
) -> TaskEncoder:
    """The encoder for `campaign.hypothesis.task`, built from the campaign's data settings.

    `label_names` is the class list in id order (PreparedData.label_names); it is required for
    classification and ignored otherwise. For images `tokenizer` is the model's image processor
    and `root` the campaign folder the image paths are relative to.
    """
    data = campaign.data
    task = campaign.hypothesis.task
    if campaign.hypothesis.is_classification:
        if not label_names:
            raise InputError(
                [
                    Problem(
                        "data.labels",
                        "no class names for a classification campaign",
                        "list them in data.labels or give training rows a label",
                    )
                ],
                title="invalid label mapping",
            )
        if task == "image_classification":
            from tunepilot.tasks.images import ImageEncoder

            return ImageEncoder(
                tokenizer, label_names, data.images, root or Path("."), seed=data.split.seed
            )
        return ClassificationEncoder(
            tokenizer, label_names, data.max_length, context_fields=data.fields.context
        )
    answers = {
        "max_length": data.max_length,
        "mask_prompt": data.mask_prompt,
        "task": task,
        "required_fields": campaign.hypothesis.required_fields,
        "schema": campaign.hypothesis.target_schema,
    }
    if data.chat is not None:
        return ChatEncoder(tokenizer, data.chat, **answers)
    return GenerationEncoder(tokenizer, data.template, **answers)


__all__ = ["ChatEncoder", "ClassificationEncoder", "GenerationEncoder", "make_encoder"]
