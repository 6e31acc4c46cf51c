"""The base's own input processors: its tokenizer and its image processor, loaded quietly.

Each is read from the folder `base.resolve_source` pinned; a missing or unusable one is bad
input naming `model.name_or_path` and how to save it next to the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tunepilot.errors import InputError, Problem
from tunepilot.model.base import ModelSource


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' warnings and progress bars for one load, then restore them.

    The LOAD REPORT and "Loading weights" bars go to stderr; tunepilot keeps the same facts in
    its own notes (missing / unexpected keys) and prints them where they belong.
    """
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def load_tokenizer(source: ModelSource, trust_remote_code: bool = False) -> Any:
    """The base's tokenizer; without a pad token, pad = eos, and a note in `source.notes` says so.

    Batching needs a pad token; decoder-only bases often ship without one. Reusing eos is the
    usual choice and is harmless because padded positions carry no attention and no loss. The
    note goes to the source's notes because that is what runs record next to the base.
    """
    from transformers import AutoTokenizer

    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(
                str(source.path), trust_remote_code=trust_remote_code
            )
    except (OSError, ValueError) as exc:
        raise InputError(
            [
                Problem(
                    "model.name_or_path",
                    f"no usable tokenizer in {source.path} ({str(exc).splitlines()[0][:200]})",
                    "save the tokenizer next to the model (`tokenizer.save_pretrained(dir)`)",
                )
            ],
            title="tokenizer not available",
        ) from exc
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise InputError(
                [
                    Problem(
                        "model.name_or_path",
                        f"the tokenizer in {source.path} has neither a pad nor an eos token",
                        "add a pad token to the tokenizer and save it with the model",
                    )
                ],
                title="tokenizer cannot pad",
            )
        tokenizer.pad_token = tokenizer.eos_token
        note = (
            f"tokenizer has no pad token: using eos {tokenizer.eos_token!r} "
            f"(id {tokenizer.eos_token_id}) for padding"
        )
        if note not in source.notes:
            source.notes.append(note)
    return tokenizer


def load_image_processor(source: ModelSource, trust_remote_code: bool = False) -> Any:
    """The base's own image processor (resize, rescale, normalise as it was pretrained)."""
    from transformers import AutoImageProcessor

    try:
        with quiet_transformers():
            return AutoImageProcessor.from_pretrained(
                str(source.path), trust_remote_code=trust_remote_code
            )
    except (OSError, ValueError) as exc:
        raise InputError(
            [
                Problem(
                    "model.name_or_path",
                    f"no usable image processor in {source.path} "
                    f"({str(exc).splitlines()[0][:200]})",
                    "save it next to the model (`AutoImageProcessor...save_pretrained(dir)`)",
                )
            ],
            title="image processor not available",
        ) from exc
