"""The target architecture of a dry run: a config.json, never weights.

`model.name_or_path` may be a shipped config name (`llama-3-8b-config`, ... in
`tunepilot/sizing/configs/`, each with its `_source`), a folder that holds config.json (weights
optional: a folder with just config.json and tokenizer files is enough), the bundled `minilm`,
or a pinned hub id already in the local cache. Bad input names the file and the fix: a
config.json that is not JSON or lacks `model_type`, an architecture transformers does not know.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from tunepilot.campaign import ModelSettings
from tunepilot.errors import InputError, input_error

SHIPPED_SUFFIX = "-config"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt")


@dataclass
class ArchitectureConfig:
    """config.json as a dict, where it came from, and the tokenizer folder if one is there."""

    config: dict[str, Any]
    path: Path
    source: str  # a sentence: the shipped file's source, or the folder
    tokenizer_dir: Path | None
    layers_key: str = "num_hidden_layers"

    @property
    def layers(self) -> int:
        return int(self.config[self.layers_key])

    @property
    def architecture(self) -> str:
        names = self.config.get("architectures") or [self.config.get("model_type", "?")]
        return str(names[0])

    def with_layers(self, n: int) -> dict[str, Any]:
        """The config with `n` decoder blocks (per-layer lists cut to match)."""
        out = dict(self.config)
        out[self.layers_key] = n
        for key in ("layer_types",):
            if isinstance(out.get(key), list):
                out[key] = out[key][:n]
        return out


def shipped_configs() -> dict[str, Path]:
    """Shipped config name -> file."""
    folder = Path(str(files("tunepilot").joinpath("sizing", "configs")))
    return {p.stem: p for p in sorted(folder.glob("*.json"))}


def architecture_config(settings: ModelSettings, root: Path) -> ArchitectureConfig:
    """Find and check the config.json `model.name_or_path` stands for (InputError when bad)."""
    name = settings.name_or_path.strip()
    shipped = shipped_configs()
    if name in shipped:
        config = read_config(shipped[name])
        source = str(config.get("_source", shipped[name].name))
        return _checked(config, shipped[name], f"shipped config {name} ({source})", None)
    folder = Path(name).expanduser()
    folder = folder if folder.is_absolute() else root / folder
    if folder.is_file() and folder.name.endswith(".json"):
        folder = folder.parent
    if not folder.is_dir():
        from tunepilot.model.base import resolve_source

        try:
            folder = Path(resolve_source(settings, root=root).path)
        except InputError as exc:
            names = ", ".join(shipped)
            raise input_error(
                "model.name_or_path",
                f"`{name}` is neither a folder with config.json nor a model in the local cache",
                f"set model.name_or_path to a folder that holds config.json, or to a shipped "
                f"config: {names}",
                title="no architecture to size",
            ) from exc
    path = folder / "config.json"
    if not path.is_file():
        raise input_error(
            str(folder),
            "this folder has no config.json",
            "put the model's config.json there (tokenizer files optional, weights never read)",
            title="no architecture to size",
        )
    tokenizer = folder if any((folder / f).is_file() for f in _TOKENIZER_FILES) else None
    return _checked(read_config(path), path, f"{path}", tokenizer)


def read_config(path: Path) -> dict[str, Any]:
    """config.json as a dict, or an InputError naming the file, the line and the fix."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise input_error(
            f"{path}:{exc.lineno}",
            f"not valid JSON ({exc.msg})",
            "replace it with the model's config.json as published with the model",
            title="invalid config.json",
        ) from None
    except UnicodeDecodeError:
        raise input_error(
            str(path), "not a text file", "replace it with the model's config.json",
            title="invalid config.json",
        ) from None  # fmt: skip
    if not isinstance(config, dict) or not config.get("model_type"):
        raise input_error(
            str(path),
            "no `model_type` key, so it is not a Hugging Face model config",
            "use the config.json written by `save_pretrained` (it names model_type, e.g. llama)",
            title="invalid config.json",
        )
    return config


def _checked(
    config: dict[str, Any], path: Path, source: str, tokenizer: Path | None
) -> ArchitectureConfig:
    """The config's architecture must be one transformers knows, with a layer count."""
    import transformers
    from transformers import CONFIG_MAPPING

    model_type = str(config["model_type"])
    if model_type not in CONFIG_MAPPING:
        raise input_error(
            f"{path} model_type",
            f"architecture `{model_type}` is not known to transformers {transformers.__version__}",
            "check model_type for a typo, or install a transformers release that supports this "
            "architecture (architectures that need remote code cannot be sized here)",
            title="unknown architecture",
        )
    attribute_map = getattr(CONFIG_MAPPING[model_type], "attribute_map", {}) or {}
    layers_key = attribute_map.get("num_hidden_layers", "num_hidden_layers")
    layers = config.get(layers_key)
    if not isinstance(layers, int) or layers < 1:
        raise input_error(
            f"{path} {layers_key}",
            f"`{layers_key}` is {layers!r}, not a positive whole number of decoder blocks",
            f"set {layers_key} as in the model's published config.json",
            title="invalid config.json",
        )
    _check_sizes(config, path, attribute_map)
    from tunepilot.model.build import transformers_config

    transformers_config(model_type, {k: v for k, v in config.items()
                                     if not k.startswith("_") and k != "model_type"}, str(path))
    return ArchitectureConfig(config, path, source, tokenizer, layers_key)


SIZE_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
             "vocab_size", "head_dim", "max_position_embeddings")  # fmt: skip
"""Shapes of the model's tensors: each must be a positive whole number where config.json sets
it (null means "the architecture's default"). transformers checks some of them, not all: a
negative hidden_size only fails when a tensor of that size is made."""


def _check_sizes(config: dict[str, Any], path: Path, attribute_map: dict[str, str]) -> None:
    for name in SIZE_KEYS:
        key = attribute_map.get(name, name)
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):  # fmt: skip
            raise input_error(
                f"{path} {key}",
                f"`{key}` is {value!r}, not a positive whole number",
                f"set {key} as in the model's published config.json",
                title="invalid config.json",
            )
    heads = config.get(attribute_map.get("num_attention_heads", "num_attention_heads"))
    groups = config.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(groups, int) and heads % groups:
        raise input_error(
            f"{path} num_key_value_heads",
            f"{heads} attention heads cannot share {groups} key/value heads evenly",
            "set num_key_value_heads to a divisor of num_attention_heads, as published",
            title="invalid config.json",
        )
