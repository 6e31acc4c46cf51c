"""The optimizer every update uses (S2): AdamW over the trainable parameters only.

One builder for the loop, the pilot and the dry run, so what is sized is what trains; and the
optimizer's state as a checkpoint holds it (safetensors for tensors, JSON for the rest), read
back the same way by one process and by a sharded run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tunepilot.train.manifest import read_tensors, refusing


def build_optimizer(
    model: Any, settings: Any, lr: float | None = None, foreach: bool | None = None
) -> Any:
    """AdamW over `model`'s trainable parameters with `settings` (TrainingSettings) lr and decay.

    `foreach` None lets PyTorch choose (the multi-tensor kernel on CUDA); the dry run passes
    True to size on meta tensors the kernel a CUDA run picks.
    """
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        params, lr=lr or settings.lr, weight_decay=settings.weight_decay, foreach=foreach
    )


def optimizer_files(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split `optimizer.state_dict()` into safetensors-able tensors ("state.<param index>.
    <name>", for optimizer.safetensors) and JSON (optimizer.json)."""
    import torch

    tensors: dict[str, torch.Tensor] = {}
    other: dict[str, dict[str, Any]] = {}
    for index, per_param in state["state"].items():
        for name, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{name}"] = value.detach().contiguous()
            else:
                other.setdefault(str(index), {})[name] = value
    return tensors, {"param_groups": state["param_groups"], "non_tensor_state": other}


def read_optimizer_files(folder: Path) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """(state per parameter index, param groups) of a checkpoint's optimizer files; a file
    that cannot be read is a refusal (manifest.refusing), before anything is loaded."""
    tensors = read_tensors(folder / "optimizer.safetensors")
    per_param: dict[int, dict[str, Any]] = {}
    meta_file = folder / "optimizer.json"
    with refusing(meta_file, "optimizer state"):
        for key, value in tensors.items():
            _, index, name = key.split(".", 2)
            per_param.setdefault(int(index), {})[name] = value
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        for index, values in dict(meta["non_tensor_state"]).items():
            per_param.setdefault(int(index), {}).update(dict(values))
        groups = [dict(group) for group in meta["param_groups"]]
        for group in groups:  # JSON turned tuples into lists
            if isinstance(group.get("betas"), list):
                group["betas"] = tuple(group["betas"])
            group["params"] = [int(i) for i in group["params"]]
    return per_param, groups
