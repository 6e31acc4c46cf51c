"""LoRA's starting weights from (seed, parameter name), the same on every device and build (P1).

peft draws `lora_A` from the global generator as it creates each layer, so its values depend on
the order and the device the model is built on: a model built on meta tensors and sharded
before its weights exist (FSDP from meta, `train/sharded_build.py`) would start elsewhere than
the same campaign in one process. Every build therefore re-draws the adapter's weights with
peft's own rule for `init_lora_weights=True` (A: Kaiming-uniform with a = sqrt(5), B: zeros)
from a generator seeded by the run's seed and the parameter's name. One process and N ranks
then start from bit-identical adapters, and a run's starting point still follows from its seed.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any


def is_lora_weight(name: str) -> bool:
    """A LoRA factor peft creates (never in the base checkpoint)."""
    return ".lora_A." in name or ".lora_B." in name


def lora_start(name: str, shape: tuple[int, ...], seed: int) -> Any:
    """The fp32 starting value of LoRA factor `name` for run seed `seed`."""
    import torch

    if ".lora_B." in name:
        return torch.zeros(shape, dtype=torch.float32)
    digest = hashlib.sha256(f"tunepilot-lora:{seed}:{name}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
    value = torch.empty(shape, dtype=torch.float32)
    torch.nn.init.kaiming_uniform_(value, a=math.sqrt(5), generator=generator)
    return value


def seed_lora(model: Any, seed: int) -> int:
    """Set every LoRA factor of a materialised model to `lora_start`; returns how many."""
    import torch

    count = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if is_lora_weight(name):
                param.copy_(lora_start(name, tuple(param.shape), seed).to(param.dtype))
                count += 1
    return count
