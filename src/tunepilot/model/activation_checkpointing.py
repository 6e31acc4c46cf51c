"""Activation checkpointing (S3): recompute each block's activations in backward instead of
keeping them, switched on the way the loop and the dry run both need it."""

from __future__ import annotations

import warnings
from typing import Any

from tunepilot.model.setup_failure import SetupFailure
from tunepilot.verdict import Finding, Verdict


def enable_activation_checkpointing(model: Any, context_fn: Any = None) -> list[str]:
    """Recompute activations in backward (S3), non-reentrant; returns notes.

    Non-reentrant checkpointing propagates gradients even when the checkpointed block's inputs
    do not require grad (frozen embeddings under LoRA); input grads are still enabled under
    peft because some remote-code models use reentrant checkpointing regardless.
    `context_fn` is `torch.utils.checkpoint`'s own hook (contexts for the forward and the
    recompute): a run passes none; the dry run passes one that replays autocast's casts at
    recompute on meta tensors, which torch's autocast cannot see.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise SetupFailure(
            Finding(
                "activation-checkpointing",
                Verdict.FAIL,
                f"{type(base).__name__} does not support activation checkpointing; set "
                "training.activation_checkpointing=false",
                "S3",
            ),
            "training.activation_checkpointing",
        )
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if context_fn is not None:
        kwargs["context_fn"] = context_fn
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    notes = [f"activation checkpointing on ({type(base).__name__}, non-reentrant)"]
    if base is not model and hasattr(base, "enable_input_require_grads"):
        base.enable_input_require_grads()
        notes.append("input embeddings emit grads (frozen embeddings under LoRA)")
    if getattr(base.config, "use_cache", False):
        base.config.use_cache = False  # a KV cache is useless in training and breaks recompute
        notes.append("config.use_cache set to False")
    return notes
