"""Bytes per rank of FSDP from meta (B4), from one dry run of the campaign's step.

What `train/sharded_build.py` allocates on each of N ranks, term by term:

- device, resident: 1/N of the weights, of the gradients and of the optimizer state (FSDP2
  shards every parameter's dimension 0; uneven shards are padded, a rounding here);
- device, transient: the activations and temporaries of the whole microbatch (data parallel:
  each rank runs a full microbatch) and the unsharded weights of two decoder blocks, the one
  computing and the next one FSDP2 all-gathers ahead of it (its default implicit prefetch);
- device, gathered through the step: the weights outside the decoder blocks (embeddings,
  final norm, head), one unit `train.distributed.shard_units` keeps unsharded from the
  forward through the backward, because the chunked loss applies the head after the model's
  forward returned (`outer_unit_bytes`);
- host RAM while loading: 1/N of the weights (each rank reads only its rows of the safetensors
  files), plus the rows of one tensor being copied. No rank ever holds a full copy.

The dry run measures one replica's step (`DryRun`); the per-block weights come from the
difference between its 2- and 3-block measurements (`DryRun.block_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PREFETCHED_BLOCKS = 2


@dataclass(frozen=True)
class FsdpRankBytes:
    """One rank's bytes under FSDP from meta on `ranks` GPUs."""

    ranks: int
    device_peak: int  # the highest training or evaluation phase, per rank
    sharded_state: int  # weights + gradients + optimizer state, 1/N
    gathered_blocks: int  # the unsharded blocks alive at once, and the outer unit
    host_load: int  # host RAM a rank needs while it fills its shards

    def sentence(self) -> str:
        from tunepilot.measure.memory import human_bytes

        return (f"FSDP from meta over {self.ranks}: {human_bytes(self.device_peak)} per GPU "
                f"({human_bytes(self.sharded_state)} sharded state, "
                f"{human_bytes(self.gathered_blocks)} for {PREFETCHED_BLOCKS} gathered blocks); "
                f"{human_bytes(self.host_load)} of host RAM per rank while loading")  # fmt: skip


def outer_unit_bytes(dry: Any, weights: int) -> int:
    """Of a replica's `weights`, those outside its decoder blocks: the FSDP unit of the
    embeddings, the final norm and the head, gathered whole from the forward through the
    backward. Zero where the dry run measured one depth only (no block size to subtract)."""
    if not dry.block_bytes:
        return 0
    return max(0, weights - dry.layers * dry.block_bytes)


def fsdp_rank_bytes(dry: Any, ranks: int) -> FsdpRankBytes:
    """`dry` (a DryRun of one replica) as each of `ranks` FSDP ranks holds it."""
    top = dry.peak()
    state = top.weights + top.gradients + top.optimizer
    block = dry.block_bytes or top.weights // max(1, dry.layers)
    sharded = math.ceil(state / ranks)
    outer = outer_unit_bytes(dry, top.weights)
    gathered = PREFETCHED_BLOCKS * block + outer - outer // ranks
    device = top.peak - state + sharded + gathered
    host = math.ceil(top.weights / ranks) + block
    return FsdpRankBytes(ranks, device, sharded, gathered, host)
