"""The loop's input side (S2): each update's microbatches collated on the host, their targets
counted there, and copied to the device without waiting for it.

A GPU step is launched asynchronously: the Python thread runs ahead until something reads a
value on the host. `UpdateFeed` uses that time. The loop asks for the next update's tensors
(`prefetch`) after launching this update's forward and backward and before it reads the loss
and gradient norm (the update's one host sync): collation, the target count and the copies of
update n + 1 overlap the device's work on update n. The copies come from pinned host memory
with `non_blocking=True` on CUDA, so they do not serialise with the compute either; on the CPU
the tensors are used where they are, and nothing changes.

Target counts are taken from the host tensors before the copy (`count_targets` on the device
would be one more sync per microbatch).

Resume (R1) must never see a prefetched update as consumed: `state_dict()` is the sampler's
state *before* the pending update was drawn, so a checkpoint after update n resumes at n + 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tunepilot.train.batching import Kind, UpdateBatch, UpdateSampler, collate, count_targets


@dataclass
class FedUpdate:
    """One update as this rank trains it: the sampler's batch, its microbatches on the device,
    and the number of targets among them (counted on the host)."""

    batch: UpdateBatch
    microbatches: list[dict[str, Any]]
    targets: int


class UpdateFeed:
    """Draws updates from `sampler`, one ahead at most, ready on `device`."""

    def __init__(self, sampler: UpdateSampler, data: Sequence[Any], kind: Kind, pad_id: int,
                 device: Any, packing: Any = None) -> None:  # fmt: skip
        self.sampler, self.data, self.kind, self.pad_id = sampler, data, kind, pad_id
        self.packing = packing  # packing.Packing: rows of data.max_length, or None (padded)
        self.device = device
        self._pending: FedUpdate | None = None
        self._state_before: dict[str, Any] | None = None

    def next(self) -> FedUpdate:
        """The next update: the one prefetched, or drawn and prepared now."""
        if self._pending is None:
            self.prefetch()
        fed, self._pending, self._state_before = self._pending, None, None
        assert fed is not None
        return fed

    def prefetch(self) -> None:
        """Draw and prepare the next update now (no-op when one is already pending)."""
        if self._pending is not None:
            return
        self._state_before = self.sampler.state_dict()
        batch = self.sampler.next_update()
        cuda = self.device.type == "cuda"
        host = [collate([self.data[i] for i in ids], self.kind, self.pad_id, self.packing)
                for ids in batch.microbatches or [batch.ghost or []]]  # fmt: skip
        targets = sum(count_targets(m, self.kind) for m in host) if batch.microbatches else 0
        on_device = [
            {k: (v.pin_memory() if cuda else v).to(self.device, non_blocking=cuda)
             for k, v in m.items()}
            for m in host
        ]  # fmt: skip
        self._pending = FedUpdate(batch, on_device, targets)

    def state_dict(self) -> dict[str, Any]:
        """The sampler's position after the updates handed out (never the prefetched one)."""
        return self._state_before if self._pending is not None else self.sampler.state_dict()
