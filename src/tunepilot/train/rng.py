"""Random number generator state: seed it, save it, restore it, fence it off (R1).

Resume is exact only if every generator the loop touches continues where it stopped:
Python's `random`, NumPy's legacy global generator, torch's CPU generator (dropout, LoRA
dropout) and, when present, the CUDA generators. The JSON part goes into state.json, the
tensor part into rng.safetensors: no pickle anywhere (R4).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def seed_everything(seed: int) -> None:
    """Seed every generator the loop may touch."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def capture() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(JSON-able states, tensor states) of every generator."""
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    json_part: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "numpy": {
            "name": name,
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "cuda_devices": 0,
    }
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        states = torch.cuda.get_rng_state_all()
        json_part["cuda_devices"] = len(states)
        tensors.update({f"cuda.{i}": s for i, s in enumerate(states)})
    return json_part, tensors


def restore(json_part: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Put every generator back to a captured state."""
    import numpy as np
    import torch

    py = json_part["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    npst = json_part["numpy"]
    np.random.set_state(
        (
            npst["name"],
            np.array(npst["keys"], dtype=np.uint32),
            npst["pos"],
            npst["has_gauss"],
            npst["cached_gaussian"],
        )
    )
    torch.set_rng_state(tensors["torch_cpu"])
    saved = int(json_part.get("cuda_devices", 0))
    if saved and torch.cuda.is_available():
        count = min(saved, torch.cuda.device_count())
        torch.cuda.set_rng_state_all([tensors[f"cuda.{i}"] for i in range(count)])


@contextlib.contextmanager
def fenced() -> Iterator[None]:
    """Run a block (evaluation, a callback) without moving the training generators.

    Evaluation may sample or shuffle; fencing it keeps the training trajectory identical
    whether or not, and how often, evaluation runs - and therefore identical after resume.
    """
    state = capture()
    try:
        yield
    finally:
        restore(*state)
