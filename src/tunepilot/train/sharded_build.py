"""FSDP that shards before it loads (B4): no rank ever holds the whole base, on the device or in
host RAM.

Loading the base on every rank and then sharding it (`distributed.wrap_model`) needs a full
copy per rank before the first shard exists: a 70B base (140 GB in bf16) never reaches the
shard step on 80 GB cards, and eight ranks on one machine read 8 x 140 GB into host RAM. Here,
in the order each step needs the one before:

1. the base is built from its config.json with every parameter on the meta device (no bytes)
   and its computed buffers (rotary frequencies) real (`model.build.build_from_config`);
2. the campaign's method is applied to it (LoRA layers, trained weights' dtype), unchanged;
3. `fully_shard` wraps each decoder block, the Hugging Face model and the root, as the
   load-then-shard path does (`distributed.shard_units`): still no bytes;
4. `to_empty` allocates this rank's shard of every parameter on its device (1/N of them);
5. each rank fills its own shard from the safetensors files, reading only the rows it owns
   (`safe_open(...).get_slice`, memory-mapped), so host RAM per rank also stays near 1/N of
   the weights; LoRA factors, which no checkpoint holds, start from `model.lora_init` (the
   same values one process starts from);
6. the buffers built in step 1 are put back (`to_empty` left them uninitialised).

Every parameter the model expects must come from the checkpoint (a missing one is refused with
its name); what the checkpoint holds beyond is listed in the notes. The result is an ordinary
FSDP2 model: the loop, evaluation and the gathered checkpoints (`sharded.py`) treat it like one
made by `wrap_model`.

What is checked before launch (`check_fsdp`, exit 2 with the fix): a model that names no
`_no_split_modules` (FSDP would gather it whole at every forward, no memory saved), an
nf4/int8 base (bitsandbytes' quantized storage is uint8 packed per block: FSDP2 cannot shard
it without a shardable `bnb_4bit_quant_storage`, which tunepilot does not set). The world size
is not checked against the layer sizes on purpose: FSDP2 shards dimension 0 in `torch.chunk`
pieces and pads the last, so nothing has to divide (a LoRA A of rank 8 on 16 ranks leaves some
ranks an empty piece, which costs nothing). The examples per update are microbatch x
accumulation x world size (S7), whatever the world size.

A classification campaign keeps the load-then-shard path: its new head is initialised by
transformers as the base loads, which a base built on meta tensors cannot replay.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tunepilot.errors import InputError, Problem, input_error

PEFT_PREFIX = "base_model.model."


def check_fsdp(model_dir: Path, task_kind: str, base_dtype: str | None,
               trust_remote_code: bool = False) -> None:  # fmt: skip
    """Refuse an FSDP launch that cannot shard as promised, before any process starts (B4)."""
    from transformers import AutoConfig

    from tunepilot.model.build import auto_class

    problems = []
    if base_dtype in ("nf4", "int8"):
        problems.append(Problem(
            "model.base_dtype",
            f"{base_dtype} with training.distributed.strategy=fsdp: bitsandbytes keeps the "
            "quantized weights as packed uint8 blocks with their own scales, which FSDP2 "
            "cannot shard without a shardable quant storage dtype (not set by tunepilot)",
            "set model.base_dtype=bf16 for FSDP, or train the quantized base with "
            "--strategy ddp (one full quantized copy per GPU)",
        ))  # fmt: skip
    config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    mapping = auto_class(task_kind)._model_mapping  # type: ignore[arg-type]
    cls = mapping.get(type(config), None)  # transformers' lazy mapping needs the default
    blocks = getattr(cls, "_no_split_modules", None) if cls is not None else None
    if cls is not None and not blocks:
        problems.append(Problem(
            "training.distributed.strategy",
            f"{cls.__name__} names no `_no_split_modules`, so FSDP has no decoder block to "
            "shard on its own and would gather the whole model at every forward",
            "use --strategy ddp for this model",
        ))  # fmt: skip
    if problems:
        raise InputError(problems, title="FSDP cannot shard this campaign")


def build_sharded_model(campaign: Any, source: Any, ctx: Any, seed: int,
                        pad_token_id: int | None = None) -> Any:  # fmt: skip
    """The campaign's model as FSDP2 shards on this rank, filled from `source`'s safetensors."""
    import torch

    from tunepilot.model.base_dtype import resolve_base_dtype
    from tunepilot.model.build import apply_method, build_from_config
    from tunepilot.train.distributed import shard_units
    from tunepilot.train.rng import seed_everything

    kind = "classification" if campaign.hypothesis.is_classification else "causal_lm"
    if kind != "causal_lm":
        raise ValueError("FSDP from meta builds causal LMs; classification loads, then shards")
    base_dtype, _ = resolve_base_dtype(campaign.model.base_dtype, ctx.device.split(":")[0])
    config = json.loads((Path(source.path) / "config.json").read_text(encoding="utf-8"))
    seed_everything(seed)
    loaded = build_from_config(config, source, kind, campaign.model, None, base_dtype,
                               pad_token_id=pad_token_id, real_buffers=True)  # fmt: skip
    model = apply_method(loaded, campaign.model, campaign.training.weights_dtype)
    for adapter in (getattr(model, "peft_config", None) or {}).values():
        adapter.base_model_name_or_path = campaign.model.name_or_path
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()
               if b.device.type != "meta"}  # fmt: skip
    model = shard_units(model, ctx)
    model.to_empty(device=torch.device(ctx.device))
    with torch.no_grad():
        for name, saved in buffers.items():
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner).get_buffer(leaf).copy_(saved)
        fill_shards(model, Path(source.path), seed)
    model.train()
    return model


def checkpoint_name(name: str) -> str:
    """The base checkpoint's key for a model parameter (PEFT's wrapper names removed)."""
    name = name.removeprefix(PEFT_PREFIX)
    return name.replace(".base_layer.", ".")


def fill_shards(model: Any, folder: Path, seed: int) -> list[str]:
    """Copy this rank's rows of every parameter from the safetensors files in `folder`; LoRA
    factors from `lora_start`. Returns notes; a parameter the files lack is refused."""
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from tunepilot.model.lora_init import is_lora_weight, lora_start

    files = _weight_files(folder)
    missing, used = [], set()
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        if isinstance(param, DTensor):
            _, offset = compute_local_shape_and_global_offset(
                param.shape, param.device_mesh, param.placements)
        else:
            offset = (0,) * param.dim()
        rows = slice(offset[0], offset[0] + local.shape[0]) if param.dim() else None
        if is_lora_weight(name):
            full = lora_start(name, tuple(param.shape), seed)
            local.copy_(full[rows] if rows is not None else full)
            continue
        key = checkpoint_name(name)
        if key not in files:
            missing.append(key)
            continue
        used.add(key)
        # One mapping per tensor, closed at once: the file pages it touched count in this
        # process's RSS only while it is open (a file held open would add them all up).
        with safe_open(str(files[key]), framework="pt") as handle:
            view = handle.get_slice(key)
            value = view[rows] if rows is not None else view[:]
            local.copy_(value.to(local.dtype))
            del value
    if missing:
        raise input_error(
            str(folder), f"{len(missing)} weights the model needs are not in its safetensors "
            f"files (e.g. {', '.join(missing[:3])})",
            "point model.name_or_path at the checkpoint of this architecture, or train with "
            "--strategy ddp (transformers' own loading)", title="checkpoint does not match",
        )  # fmt: skip
    unused = sorted(set(files) - used)
    return [f"{len(unused)} checkpoint entries unused, e.g. {unused[:5]}"] if unused else []


def _weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (sharded checkpoints via their index)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        raise input_error(str(folder), "no model.safetensors or model.safetensors.index.json",
                          "FSDP from meta reads safetensors only: convert the checkpoint")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as handle:
        return dict.fromkeys(handle.keys(), single)
