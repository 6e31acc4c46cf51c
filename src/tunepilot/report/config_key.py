"""A run's configuration without its seed, the key the dossier groups seeds of one experiment
by (runs whose campaign file changed between them read as different configurations, V1, V2).

The runner writes the whole resolved campaign next to every run, every variant in it: at
5,000 runs of a 250-variant campaign, parsing each file was most of the report's time.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

_RUN_BLOCK = re.compile(r"^(_run|tracking):.*?(?=^\S|\Z)", re.M | re.S)
_TRAINING_SEED = re.compile(r"^(training:\n(?:  .*\n)*?)  seed: -?\d+\n", re.M)


def config_key(folder: Path, keys: dict[str, str | None]) -> str | None:
    """The run's resolved configuration without its seed: seeds of one experiment share it.

    Parsed once per distinct configuration: the text without what the key ignores (the
    `_run` and `tracking` blocks, the training seed, as the runner writes them) is looked up
    first, so 5,000 seeds of 250 configurations cost 250 parses. A file in another shape keeps
    its seed in that text: it is then parsed on its own, never merged with another."""
    from tunepilot.campaign.yaml_reader import load_yaml

    try:
        text = (folder / "config.resolved.yaml").read_text(encoding="utf-8")
    except OSError:
        return None
    bare = _TRAINING_SEED.sub(r"\1", _RUN_BLOCK.sub("", text), count=1)
    if bare in keys:
        return keys[bare]
    try:
        config = load_yaml(text)
    except yaml.YAMLError:
        config = None
    keys[bare] = _seedless_hash(config)
    return keys[bare]


def _seedless_hash(config: Any) -> str | None:
    """compare's own key (experiments.eligibility.settings_key): one answer to "are these
    seeds of one experiment", in the dossier and in the comparison."""
    from tunepilot.experiments.eligibility import settings_key

    return settings_key(config) if isinstance(config, dict) else None
