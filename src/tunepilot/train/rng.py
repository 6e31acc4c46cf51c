"""Random number generator state: seed it, save it, restore it, fence it off (R1).

Resume is exact only if every generator the loop touches continues where it stopped:
Python's `random`, NumPy's legacy global generator, torch's CPU generator (dropout, LoRA
dropout) and, when present, the CUDA generators. The JSON part goes into state.json, the
tensor part into rng.safetensors: no pickle anywhere (R4).

With data replicas (B3, B4) every rank draws its own dropout masks, so a checkpoint holds
every rank's generators (`gather`, `to_files`) and each rank restores its own (`of_rank`).
Rank 0's stay where a single process writes them ("rng" in state.json, "torch_cpu" in
rng.safetensors), so a world-size-1 checkpoint is unchanged; rank r > 0 adds
state.json "rng_ranks" {"r": ...} and tensors "rank<r>.torch_cpu", "rank<r>.cuda.0".
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

Captured = tuple[dict[str, Any], dict[str, "torch.Tensor"]]
"""What `capture` returns: (JSON-able states, tensor states)."""


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


# ---------------------------------------------------------------------------------------------
# every rank's generators in one checkpoint
# ---------------------------------------------------------------------------------------------


def gather(rank: int, world_size: int) -> list[Captured] | None:
    """Every rank's `capture()` on rank 0, in rank order; None on the other ranks.

    A collective: every rank calls it at the same point of the loop. Each state travels as
    safetensors bytes in a CPU uint8 tensor (gloo, also under "cpu:gloo,cuda:nccl"), so no
    pickle passes between ranks either.
    """
    if world_size == 1:
        return [capture()]
    import torch
    import torch.distributed as dist
    from safetensors.torch import load, save

    json_part, tensors = capture()
    text = json.dumps(json_part, allow_nan=False).encode("utf-8")
    blob = save({**tensors, "json": torch.frombuffer(bytearray(text), dtype=torch.uint8)})
    size = torch.tensor([len(blob)], dtype=torch.long)
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size)
    padded = torch.zeros(max(int(s) for s in sizes), dtype=torch.uint8)
    padded[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    received = [torch.zeros_like(padded) for _ in range(world_size)] if rank == 0 else None
    dist.gather(padded, received, dst=0)
    if received is None:
        return None
    states: list[Captured] = []
    for buffer, length in zip(received, sizes, strict=True):
        loaded = load(buffer[: int(length)].numpy().tobytes())
        text_part = loaded.pop("json").numpy().tobytes().decode("utf-8")
        states.append((json.loads(text_part), loaded))
    return states


def to_files(states: Sequence[Captured]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(state.json entries, rng.safetensors tensors) for the ranks' states, rank 0 first."""
    entries: dict[str, Any] = {"rng": states[0][0]}
    tensors = {key: value.contiguous() for key, value in states[0][1].items()}
    for r, (json_part, own) in enumerate(states[1:], start=1):
        entries.setdefault("rng_ranks", {})[str(r)] = json_part
        tensors.update({f"rank{r}.{key}": value.contiguous() for key, value in own.items()})
    return entries, tensors


def of_rank(state: dict[str, Any], tensors: dict[str, torch.Tensor], rank: int) -> Captured | None:
    """This rank's saved generators, or None for a rank > 0 of a checkpoint written before
    every rank's were saved (the caller then reseeds, and the resume is not exact)."""
    if rank == 0:
        return state["rng"], {k: v for k, v in tensors.items() if not k.startswith("rank")}
    json_part = state.get("rng_ranks", {}).get(str(rank))
    if json_part is None:
        return None
    prefix = f"rank{rank}."
    return json_part, {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
