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
