"""Data replicas: process groups, DDP and FSDP2 wrapping (B3, B4).

Every rank runs the same loop (`loop.train`) on its share of each update; what differs between
the strategies is who holds which state and therefore who must join which collective:

* `ddp` (B3): every rank keeps a full replica; `DistributedDataParallel` averages gradients
  in backward. Evaluation and checkpoints need no other rank: rank 0 uses the inner model.
* `fsdp` (B4): FSDP2 `fully_shard` keeps 1/world of every parameter, gradient and optimizer
  state per rank and all-gathers a block's weights just before it runs. Gradients are
  reduce-scattered (averaged, like DDP) in backward. Any forward, evaluation included, is a
  collective, and so is gathering the state for a checkpoint: every rank joins both, and
  rank 0 alone writes the files (`sharded.py`).

Exit: `shutdown` calls `dist.barrier()` before `destroy_process_group()`: without it gloo
sometimes aborts at exit (ENV.md: 2 of 34 runs), turning a finished run into exit code 1.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from tunepilot.errors import input_error

if TYPE_CHECKING:
    pass

Strategy = Literal["ddp", "fsdp"]
STRATEGIES: tuple[str, ...] = ("ddp", "fsdp")
T = TypeVar("T")
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in the group, read from torchrun's environment."""

    rank: int
    world_size: int
    local_rank: int
    device: str  # "cpu" or "cuda:<local rank>"
    backend: str  # "gloo" on CPU, "cpu:gloo,cuda:nccl" on CUDA

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_process_group_from_env(backend: str | None = None) -> DistContext:
    """Join the group torchrun set up: gloo on CPU; on CUDA one GPU per local rank, nccl for
    CUDA tensors and gloo for the CPU scalars the loop all-reduces (target counts, losses,
    the wall-clock decision), which nccl alone cannot carry."""
    missing = [key for key in _TORCHRUN_ENV if key not in os.environ]
    if missing:
        raise input_error(
            "environment",
            f"{', '.join(missing)} not set: this entry point is started by torchrun",
            "launch it with `tunepilot run --nproc N`, or "
            "`torchrun --nproc_per_node N -m tunepilot.experiments.worker ...`",
            title="not inside torchrun",
        )
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise input_error(
                "--nproc",
                f"local rank {local_rank} but {torch.cuda.device_count()} visible GPU(s)",
                "start at most one process per GPU on each node (check CUDA_VISIBLE_DEVICES)",
                title="more processes than GPUs",
            )
        torch.cuda.set_device(local_rank)
        device, default_backend = f"cuda:{local_rank}", "cpu:gloo,cuda:nccl"
    else:
        device, default_backend = "cpu", "gloo"
    chosen = backend or default_backend
    if not dist.is_initialized():
        dist.init_process_group(backend=chosen)
    return DistContext(rank, world, local_rank, device, chosen)


def shutdown(ctx: DistContext, clean: bool = True) -> None:
    """Leave the group. `clean=False` after an error: a barrier would wait for ranks that may
    be stuck in another collective; the process exits non-zero and torchrun stops the rest."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if clean:
        dist.barrier()  # ENV.md: without it gloo sometimes aborts at exit (SIGABRT)
        dist.destroy_process_group()


def on_rank0(rank: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """Call `fn` on rank 0 only (files, the ledger, the console); None elsewhere."""
    return fn(*args, **kwargs) if rank == 0 else None


def broadcast_text(text: str | None, ctx: DistContext, src: int = 0) -> str:
    """Rank `src`'s `text` on every rank (e.g. the run id), as bytes in a tensor: no pickle."""
    if ctx.world_size == 1:
        return text or ""
    import torch
    import torch.distributed as dist

    data = (text or "").encode("utf-8") if ctx.rank == src else b""
    size = torch.tensor([len(data)], dtype=torch.long, device=ctx.device)
    dist.broadcast(size, src=src)
    buffer = torch.zeros(int(size.item()), dtype=torch.uint8, device=ctx.device)
    if ctx.rank == src and data:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    if buffer.numel():
        dist.broadcast(buffer, src=src)
    return bytes(buffer.cpu().tolist()).decode("utf-8")


def first_given_text(text: str | None, ctx: DistContext) -> str | None:
    """The `text` of the lowest rank that was given one, on every rank (None if no rank was).

    Several nodes: the node whose launcher reserved the run id need not hold global rank 0,
    since torchrun's c10d rendezvous orders nodes by address, not by the order they were
    started in; rank 0 records the run under the id whichever node reserved it."""
    if ctx.world_size == 1:
        return text
    import torch
    import torch.distributed as dist

    owner = torch.tensor([ctx.rank if text else ctx.world_size], dtype=torch.long,
                         device=ctx.device)  # fmt: skip
    dist.all_reduce(owner, op=dist.ReduceOp.MIN)
    src = int(owner.item())
    return None if src == ctx.world_size else broadcast_text(text, ctx, src=src)


def all_gather_text(text: str, world_size: int) -> list[str]:
    """Every rank's `text`, in rank order, on every rank: UTF-8 bytes in CPU tensors (gloo),
    never a pickle."""
    if world_size == 1:
        return [text]
    import torch
    import torch.distributed as dist

    data = text.encode("utf-8")
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world_size)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.long))
    width = max(int(s.item()) for s in sizes)
    mine = torch.zeros(width, dtype=torch.uint8)
    if data:
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out = [torch.zeros(width, dtype=torch.uint8) for _ in range(world_size)]
    dist.all_gather(out, mine)
    return [bytes(t[: int(s.item())].tolist()).decode("utf-8") for t, s in zip(out, sizes,
                                                                              strict=True)]


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def all_reduce_value(value: float, world_size: int) -> float:
    """`value` summed over the ranks (as float64: a target count must stay exact)."""
    if world_size == 1:
        return value
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor)
    return float(tensor.item())


def all_reduce_grads(params: list[Any]) -> None:
    """Sum gradients over replicas; the loss is already divided by the global count."""
    import torch
    import torch.distributed as dist

    for p in params:
        if p.grad is None:  # a rank without a share of a partial update still joins in
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)


# ---------------------------------------------------------------------------------------------
# wrapping
# ---------------------------------------------------------------------------------------------


def wrap_model(model: Any, strategy: str, ctx: DistContext) -> Any:
    """Move `model` to this rank's device and wrap it for `strategy` ("ddp" or "fsdp").

    FSDP2 units, innermost first: every transformer block (the classes the model lists in
    `_no_split_modules`), then the Hugging Face model itself when a PEFT model wraps it (so
    that `generate`, which calls it directly and not the PEFT root, still gathers the
    embeddings and the head), then the root. LoRA and frozen weights share a unit; FSDP2
    reduce-scatters only the gradients that exist.
    """
    if strategy not in STRATEGIES:
        raise input_error(
            "training.distributed.strategy",
            f"{strategy!r}",
            f"use one of {', '.join(STRATEGIES)}",
            title="unknown strategy",
        )
    import torch

    model = model.to(torch.device(ctx.device))
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [ctx.local_rank] if ctx.device.startswith("cuda") else None
        return DistributedDataParallel(model, device_ids=ids)

    return shard_units(model, ctx)


def shard_units(model: Any, ctx: DistContext) -> Any:
    """`fully_shard` the units `wrap_model` names, on the model's own device: real tensors
    (the load-then-shard path) or meta ones (sharded_build.py: shard first, then fill)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(ctx.device.split(":")[0], (ctx.world_size,))
    hf_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    blocks = set(getattr(hf_model, "_no_split_modules", None) or [])
    for module in list(model.modules()):
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    if hf_model is not model:
        # The chunked loss (train.loss) applies the head after the model's forward returned,
        # and backpropagates into the final norm through the hidden state it captured; FSDP2
        # keeps the root's own weights gathered after forward, this unit must too.
        fully_shard(hf_model, mesh=mesh, reshard_after_forward=False)
    return fully_shard(model, mesh=mesh)


def is_fully_sharded(model: Any) -> bool:
    """True for an FSDP2 (`fully_shard`) model: it has no `no_sync`, reduce-scatters its own
    gradients, and every rank must join its forwards and state gathers."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch build without distributed support
        return False

    return isinstance(model, FSDPModule)
