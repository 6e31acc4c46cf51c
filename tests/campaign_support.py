"""Campaign mappings the campaign and data tests share (pytest puts this folder on sys.path)."""

from __future__ import annotations

import copy
from typing import Any


def with_setting(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A deep copy of the campaign mapping `raw` with the dotted `key` set to `value`."""
    out = copy.deepcopy(raw)
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def files_campaign(files: dict[str, str], cleaning: list[str]) -> dict[str, Any]:
    """A classification campaign reading one file per split (`split -> file name`), with
    `text` and `label` fields and the given cleaning rules."""
    return {
        "name": "c",
        "hypothesis": {"behaviour": "b", "task": "classification"},
        "model": {"name_or_path": "m"},
        "data": {
            "files": files,
            "fields": {"text": "text", "label": "label"},
            "cleaning": cleaning,
        },
    }


def prompt_masked(i: int, ids: list[int], prompt: int) -> Any:
    """Encoded example `ex{i}`: its first `prompt` tokens carry no loss."""
    from tunepilot.tasks.base import IGNORE_INDEX, Encoded

    labels = [IGNORE_INDEX] * prompt + ids[prompt:]
    return Encoded(f"ex{i}", ids, labels, prompt, False, False, len(ids))


def tiny_lm_examples(tokenizer_dir: Any, n: int, length_of: Any, prompt_of: Any) -> Any:
    """(n causal-LM examples of the tiny corpus, pad id): example i keeps `length_of(i)` tokens
    and an EOS, its first `prompt_of(i)` tokens masked, as the tiny Llama's tokenizer encodes."""
    from transformers import AutoTokenizer

    from tunepilot.model.tiny import DEFAULT_CORPUS

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    out = []
    for i in range(n):
        text = " ".join(DEFAULT_CORPUS[(i + k) % len(DEFAULT_CORPUS)] for k in range(1 + i % 3))
        ids = tok(text)["input_ids"][: length_of(i)] + [tok.eos_token_id]
        out.append(prompt_masked(i, ids, prompt_of(i)))
    return out, tok.pad_token_id
