"""The optimizer every update uses (S1, S2): the campaign's `training.optimizer` over the
trainable parameters only, stepped after backward or inside it (`optimizer_in_backward`).

One builder for the loop, the pilot and the dry run, so what is sized is what trains; and the
optimizer's state as a checkpoint holds it (safetensors for tensors, JSON for the rest), read
back the same way by one process and by a sharded run, with or without the step in backward.

The optimizers are well-kept implementations: torch's AdamW (fused on CUDA: one kernel, no
foreach temporaries), SGD and Adafactor; bitsandbytes' `AdamW8bit` and `PagedAdamW8bit`
(block-wise 8-bit moments; paged state lives in CUDA unified memory that the driver moves to
host RAM under pressure), which run on CUDA only: elsewhere `require_optimizer_backend`
refuses them with the fix, while `tunepilot size` and `plan` size them on any machine. The
one written here is `adamw_bf16_states` (bf16_moments.py says why).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunepilot.campaign.optimizer_rules import BITSANDBYTES_OPTIMIZERS
from tunepilot.errors import input_error
from tunepilot.train.manifest import read_tensors, refusing

SGD_MOMENTUM = 0.9


def build_optimizer(
    model: Any, settings: Any, lr: float | None = None, foreach: bool | None = None,
    factory: Callable[[list[Any]], Any] | None = None,
) -> Any:  # fmt: skip
    """`settings.optimizer` (TrainingSettings) over `model`'s trainable parameters, with its
    lr and decay; an `InBackward` of per-parameter ones when `optimizer_in_backward` is set.

    `foreach` None lets the builder choose (fused AdamW on CUDA, PyTorch's default elsewhere);
    `factory` replaces how one optimizer is made from a parameter list (the dry run's stand-in
    for bitsandbytes, which has no meta-tensor kernels).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    device_type = params[0].device.type if params else "cpu"
    make = factory or optimizer_factory(settings, lr or settings.lr, device_type, foreach)
    if settings.optimizer_in_backward:
        from tunepilot.train.in_backward import InBackward

        return InBackward(params, make)
    return make(params)


def optimizer_factory(
    settings: Any, lr: float, device_type: str, foreach: bool | None = None
) -> Callable[[list[Any]], Any]:
    """How one optimizer of `settings.optimizer` is made over a list of parameters."""
    import torch

    name, decay = settings.optimizer, settings.weight_decay
    if name == "adamw":
        fused = device_type == "cuda" and foreach is None  # the kernel a careful run picks
        return lambda ps: torch.optim.AdamW(ps, lr=lr, weight_decay=decay, foreach=foreach,
                                            fused=fused or None)  # fmt: skip
    if name == "adamw_bf16_states":
        from tunepilot.train.bf16_moments import AdamWBf16Moments

        return lambda ps: AdamWBf16Moments(ps, lr=lr, weight_decay=decay)
    if name == "sgd":
        return lambda ps: torch.optim.SGD(ps, lr=lr, momentum=SGD_MOMENTUM, weight_decay=decay,
                                          foreach=foreach)  # fmt: skip
    if name == "adafactor":
        return lambda ps: torch.optim.Adafactor(ps, lr=lr, weight_decay=decay, foreach=foreach)
    require_optimizer_backend(name, device_type)
    import bitsandbytes as bnb

    kind = bnb.optim.PagedAdamW8bit if name == "paged_adamw_8bit" else bnb.optim.AdamW8bit
    return lambda ps: kind(ps, lr=lr, weight_decay=decay)


def require_optimizer_backend(name: str, device_type: str) -> None:
    """Refuse a bitsandbytes optimizer where it cannot step: anywhere but CUDA (its CPU
    kernels are neither installed nor proven deterministic here), or without bitsandbytes."""
    if name not in BITSANDBYTES_OPTIMIZERS:
        return
    if device_type != "cuda":
        raise input_error(
            "training.optimizer",
            f"{name} (bitsandbytes 8-bit) steps on a CUDA GPU and this machine trains on "
            f"{device_type}",
            "set training.optimizer=adamw (or adamw_bf16_states) to run here; `tunepilot size` "
            f"and `tunepilot plan` still size {name} without a GPU, and it trains on the "
            "rented CUDA card",
            title="optimizer not available",
        )
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        raise input_error(
            "training.optimizer", f"{name} needs bitsandbytes, which is not installed here",
            "pip install bitsandbytes (the build for this CUDA torch), or set "
            "training.optimizer=adamw", title="optimizer not available",
        )  # fmt: skip


def update_norm(optimizer: Any, params: list[Any], max_norm: float | None) -> Any:
    """The update's gradient norm, clipping to `max_norm` first when one is set (a 0-d tensor
    on the device). With the step in backward the hooks summed it as they stepped."""
    import math

    import torch

    if getattr(optimizer, "stepped", False):
        return optimizer.take_norm()
    return torch.nn.utils.clip_grad_norm_(params, max_norm or math.inf)


def host_values(*tensors: Any) -> list[float]:
    """The values of 0-d tensors (device or host) as floats in one transfer: on CUDA the
    update's one host sync. A sharded (DTensor) norm is made whole first."""
    import torch

    whole = [t.full_tensor() if hasattr(t, "full_tensor") else t for t in tensors]
    on = next((t.device for t in whole if isinstance(t, torch.Tensor) and t.device.type != "cpu"),
              torch.device("cpu"))  # fmt: skip
    stacked = torch.stack([torch.as_tensor(t, dtype=torch.float64).to(on).reshape(())
                           for t in whole])  # fmt: skip
    return [float(v) for v in stacked.cpu().tolist()]


def describe_optimizer(settings: Any, device_type: str) -> str:
    """What steps the weights, in words (env.json, the dossier, the pilot's rows)."""
    name = settings.optimizer
    kernel = {
        "adamw": f"torch AdamW ({'fused' if device_type == 'cuda' else 'for-loop/foreach'})",
        "adamw_bf16_states": "AdamW with bf16 moments (tunepilot)",
        "adamw_8bit": "bitsandbytes AdamW8bit", "paged_adamw_8bit": "bitsandbytes PagedAdamW8bit",
        "sgd": f"torch SGD (momentum {SGD_MOMENTUM})", "adafactor": "torch Adafactor",
    }[name]  # fmt: skip
    where = ", stepped per parameter in backward" if settings.optimizer_in_backward else ""
    return f"{kernel} over {settings.weights_dtype} trained weights{where}"


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
