"""Which examples go into which update, and how they become tensors (S2, S7, R1, B3).

The sampler is a pure function of (seed, epoch, example lengths): no global RNG, no torch
generator, nothing that depends on the process that runs it. That is what makes two things
possible:

* resume continues at the exact position by recomputing the epoch's order from its state
  (epoch, position, seed) - it never replays batches to get there (R1);
* the examples of an update do not depend on how they are spread: world 2 x accumulation 4
  and world 1 x accumulation 8 see the same examples in every update (B3, S7).

An update is a list of microbatches (lists of example indices). Only the last update of an
epoch can be partial, and only its last microbatch can be short; the loop normalises the loss
by the target count of the whole update, so a partial update is as well-defined as a full
one (S2). The two halves of that normalisation, `count_targets` (the denominator) and
`summed_loss` (the numerator), live together at the end of this file, with
`backward_update`, which applies them to one update's microbatches.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

from tunepilot.errors import InputError, Problem
from tunepilot.tasks.base import IGNORE_INDEX, Encoded
from tunepilot.train.arithmetic import UpdatePlan, plan_updates

if TYPE_CHECKING:
    import torch

    from tunepilot.train.packing import Packing

Kind = Literal["classification", "causal_lm"]

BUCKET_MICROBATCHES = 50
"""Length bucketing sorts within windows of this many microbatches: wide enough to group
similar lengths (less padding), narrow enough that the order stays well shuffled."""


@dataclass(frozen=True)
class UpdateBatch:
    """One update as this rank sees it."""

    epoch: int
    index: int  # position of the update within its epoch, 0-based
    microbatches: list[list[int]]  # this rank's microbatches, as indices into the data
    update_examples: int  # examples in the whole update, all ranks together
    ghost: list[int] | None = None  # set when this rank has no share of a partial update


class UpdateSampler:
    """Deterministic, resumable, shardable order of updates over the training data."""

    def __init__(
        self,
        lengths: Sequence[int],
        microbatch: int,
        accumulation: int,
        *,
        seed: int,
        drop_last: bool = False,
        bucket_by_length: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.lengths = list(lengths)
        self.microbatch = microbatch
        self.accumulation = accumulation
        self.seed = seed
        self.drop_last = drop_last
        self.bucket_by_length = bucket_by_length
        self.rank = rank
        self.world_size = world_size
        # One plan, shared with the sizing sheet: updates per epoch and drops come from here.
        self.plan: UpdatePlan = plan_updates(
            len(self.lengths), microbatch, accumulation, world_size, updates=1, drop_last=drop_last
        )
        self.epoch = 0
        self.position = 0  # updates already taken from the current epoch
        self._data_key = hashlib.sha256(repr(self.lengths).encode()).hexdigest()[:16]
        self._epoch_cache = lru_cache(maxsize=2)(self._epoch_microbatches)

    # -- order ---------------------------------------------------------------------------

    def _rng(self, epoch: int, purpose: str) -> random.Random:
        # A string seed goes through sha512 inside `random`: stable across processes and
        # Python hash seeds, and (seed, epoch) pairs never collide the way seed + epoch would.
        return random.Random(f"tunepilot:{purpose}:{self.seed}:{epoch}")

    def _epoch_microbatches(self, epoch: int) -> list[list[int]]:
        """All microbatches of one epoch, in order, for all ranks together."""
        order = list(range(len(self.lengths)))
        self._rng(epoch, "order").shuffle(order)
        if self.drop_last:
            order = order[: self.plan.updates_per_epoch * self.plan.examples_per_update]
        mb = self.microbatch
        if not self.bucket_by_length:
            return [order[i : i + mb] for i in range(0, len(order), mb)]
        # Sort inside windows, cut into microbatches, then shuffle the microbatches so that
        # updates do not go from short to long. A short microbatch (only the very last one
        # can be short, since the window is a multiple of mb) stays last so that only the
        # last update of the epoch is partial.
        window = BUCKET_MICROBATCHES * mb
        full: list[list[int]] = []
        short: list[list[int]] = []
        for start in range(0, len(order), window):
            chunk = sorted(order[start : start + window], key=lambda i: self.lengths[i])
            for i in range(0, len(chunk), mb):
                (full if len(chunk[i : i + mb]) == mb else short).append(chunk[i : i + mb])
        self._rng(epoch, "buckets").shuffle(full)
        return full + short

    def global_update(self, epoch: int, index: int) -> list[list[int]]:
        """The microbatches of update `index` of `epoch`, all ranks together."""
        per_update = self.accumulation * self.world_size
        return self._epoch_cache(epoch)[index * per_update : (index + 1) * per_update]

    def next_update(self) -> UpdateBatch:
        """This rank's share of the next update; advances the state."""
        if self.position >= self.plan.updates_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        everything = self.global_update(self.epoch, self.position)
        # Interleave so that a partial update is spread over the ranks as evenly as possible.
        mine = everything[self.rank :: self.world_size]
        batch = UpdateBatch(
            epoch=self.epoch,
            index=self.position,
            microbatches=mine,
            update_examples=sum(len(m) for m in everything),
            # DDP needs every rank to run backward; a rank with no share runs a zero-weight
            # pass on this example so the gradient all-reduce still lines up.
            ghost=None if mine else everything[0][:1],
        )
        self.position += 1
        return batch

    # -- resume (R1) ---------------------------------------------------------------------

    _ORDER_SETTINGS = ("seed", "microbatch", "accumulation", "world_size", "drop_last",
                       "bucket_by_length")  # fmt: skip

    def _order_identity(self) -> dict[str, Any]:
        """What a saved position means only together with: the data and the batching."""
        settings = {key: getattr(self, key) for key in self._ORDER_SETTINGS}
        return {"n_examples": len(self.lengths), "lengths_key": self._data_key, **settings}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue at the exact next update."""
        return {"epoch": self.epoch, "position": self.position, **self._order_identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` stopped; refuses a state made for other data or batching."""
        mine = self._order_identity()
        problems = [
            Problem(
                f"checkpoint sampler.{key}",
                f"{state.get(key)!r} in the checkpoint, {mine[key]!r} now",
                "resume with the same data version and batching, or start a new run",
            )
            for key in mine
            if state.get(key) != mine[key]
        ]
        if problems:
            raise InputError(problems, title="the checkpoint's data order does not match")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


# ---------------------------------------------------------------------------------------------
# tensors
# ---------------------------------------------------------------------------------------------


def collate(
    examples: Sequence[Encoded], kind: Kind, pad_id: int, packing: Packing | None = None
) -> dict[str, torch.Tensor]:
    """Pad to the longest example of this microbatch (dynamic padding), on the right; with
    `packing` (data.packing, causal LM), bin-pack the examples into rows instead (packing.py).

    Causal LM labels are padded with IGNORE_INDEX so padding never carries loss; a
    classification microbatch gets one class id per example. Image examples are stacked into
    `pixel_values` (the processor already gave them one size): nothing to pad, no mask.
    """
    import torch

    if packing is not None and kind == "causal_lm":
        from tunepilot.train.packing import collate_packed

        return collate_packed(examples, pad_id, packing)
    if examples and examples[0].pixel_values is not None:
        return {
            "pixel_values": torch.stack([e.pixel_values for e in examples]),
            "labels": _class_ids(examples),
        }
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        ids[row, : len(e.input_ids)] = torch.tensor(e.input_ids, dtype=torch.long)
        mask[row, : len(e.input_ids)] = 1
    batch = {"input_ids": ids, "attention_mask": mask}
    if kind == "causal_lm":
        labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
        for row, e in enumerate(examples):
            if len(e.labels) != len(e.input_ids):
                raise ValueError(
                    f"example {e.example_id}: {len(e.labels)} labels for "
                    f"{len(e.input_ids)} tokens; a causal LM needs one label per token"
                )
            labels[row, : len(e.labels)] = torch.tensor(e.labels, dtype=torch.long)
        batch["labels"] = labels
    else:
        batch["labels"] = _class_ids(examples)
    return batch


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the model's forward takes from a collated microbatch: everything but the labels
    (the loss is computed here, summed, never by the model)."""
    return {k: v for k, v in batch.items() if k != "labels"}


def _class_ids(examples: Sequence[Encoded]) -> torch.Tensor:
    import torch

    for e in examples:
        if len(e.labels) != 1:
            raise ValueError(
                f"example {e.example_id}: classification needs one class id, "
                f"found {len(e.labels)} labels"
            )
    return torch.tensor([e.labels[0] for e in examples], dtype=torch.long)


def count_targets(batch: dict[str, torch.Tensor], kind: Kind) -> int:
    """Positions that carry loss in a collated microbatch.

    For a causal LM a label at position t is predicted from position t-1, so the first label
    of each row can never carry loss; counting after the shift keeps the normaliser equal
    to the number of terms actually summed.
    """
    labels = batch["labels"]
    if kind == "causal_lm":
        return int((labels[:, 1:] != IGNORE_INDEX).sum())
    return int(labels.numel())


def summed_loss(logits: torch.Tensor, labels: torch.Tensor, kind: Kind) -> torch.Tensor:
    """Sum (never mean) of cross-entropy over the positions `count_targets` counts.

    The numerator lives next to the denominator so the two cannot disagree about the shift:
    position t predicts label t+1 for a causal LM. The loop divides this by the target count
    of the whole update (S2).
    """
    import torch
    import torch.nn.functional as F

    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # a softmax over the vocabulary needs fp32 range
    if kind == "causal_lm":
        logits, labels = logits[:, :-1, :], labels[:, 1:]
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)),
        labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def backward_update(
    model: Any,
    microbatches: list[dict[str, torch.Tensor]],
    kind: Kind,
    normaliser: float,
    *,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    scaler: Any = None,
    is_ddp: bool = False,
    weight: float = 1.0,
    loss_chunks: int = 8,
    loss_kernel: str = "plain",
) -> torch.Tensor:
    """Forward + backward every microbatch of one update; returns the detached loss sum.

    `normaliser` is the target count of the whole update (all microbatches, all ranks), so
    the accumulated gradient is that of the update's mean loss (S2). `weight` 0 makes a pass
    that contributes nothing, for a DDP rank without a share of a partial update. A causal
    LM's loss is the chunked one of `train.loss` (`loss_chunks` pieces, `loss_kernel` the
    implementation that runs); a classifier's is `summed_loss` of its logits.
    """
    import torch

    total: Any = 0.0  # summed on the loss's device: reading it is the caller's one sync
    for i, batch in enumerate(microbatches):
        # Under DDP only the last microbatch's backward all-reduces the gradients.
        last = i == len(microbatches) - 1
        with contextlib.nullcontext() if last or not is_ddp else model.no_sync():
            loss = microbatch_loss(model, batch, kind, autocast=autocast, chunks=loss_chunks,
                                   kernel=loss_kernel) * weight  # fmt: skip
            scaled = loss / normaliser
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        total = loss.detach().to(torch.float64) + total
    return total if isinstance(total, torch.Tensor) else torch.zeros((), dtype=torch.float64)


def microbatch_loss(
    model: Any, batch: dict[str, torch.Tensor], kind: Kind, *,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    chunks: int = 8, kernel: str = "plain",
) -> torch.Tensor:  # fmt: skip
    """The summed loss of one collated microbatch, as training, the pilot and the dry run
    compute it: chunked over the loss positions for a causal LM (`train.loss`), from the
    logits for a classifier."""
    inputs = model_inputs(batch)  # token ids or pixels
    if kind == "causal_lm":
        from tunepilot.train.loss import causal_lm_summed_loss

        return causal_lm_summed_loss(model, inputs, batch["labels"], chunks=chunks,
                                     kernel=kernel, autocast=autocast, use_cache=False)  # fmt: skip
    with autocast():
        logits = model(**inputs).logits
    return summed_loss(logits, batch["labels"], kind)
