"""Packing (`data.packing`): a microbatch's examples bin-packed into rows of data.max_length
(S2, D3, D5, B3, R1).

Which examples form an update is still the sampler's (`batching.UpdateSampler`): packing only
changes how one microbatch's examples become tensors. So everything the sampler guarantees
holds unchanged: the examples of an update do not depend on the world size (B3), resume
recomputes the order from its state (R1), and examples per update are microbatch x
accumulation x replicas (S7). The rows are a pure function of the microbatch's lengths
(`pack_rows`), so the same microbatch packs the same way in every process and every resume.

Inside a row nothing crosses examples:

* position ids restart at 0 for every example, as if it were alone;
* attention stays within the example: a block-diagonal causal mask (4D, boolean for SDPA,
  additive for eager attention), or, for flash attention on CUDA, no mask at all and every row
  flattened into one, where transformers reads the example boundaries from the restarting
  position ids and runs the variable-length kernel (the padding-free path that
  `DataCollatorWithFlattening` feeds);
* the label of each example's first token is IGNORE_INDEX: nothing predicts it, as in an
  unpacked row, where the shift leaves the first label out. So the previous example's last
  token never learns to predict the next example, and `count_targets` counts exactly the
  target tokens of the unpacked microbatch: the loss normaliser is unchanged (S2).

A microbatch of m examples packs into at most m rows of at most max_length tokens (every
example fits a row, since encoding truncates at max_length): m x max_length is the packed
step's bound, which is what the dry run and the pilot size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tunepilot.tasks.base import IGNORE_INDEX, Encoded

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Packing:
    """How a microbatch is packed: rows of `length` tokens, and the mask the model's attention
    takes: "sdpa" (boolean 4D), "eager" (additive 4D) or "flash" (every row joined into one,
    no padding, no mask: the variable-length kernel reads the restarting position ids)."""

    length: int
    attention: str = "sdpa"

    @property
    def flatten(self) -> bool:
        return self.attention == "flash"

    def for_model(self, model: Any) -> Packing:
        """The layout the model's attention implementation needs."""
        return replace(self, attention=attention_of(model))

    def to_json(self) -> dict[str, Any]:
        return {"row_length": self.length, "attention": self.attention}


def packing_of(campaign: Any) -> Packing | None:
    """The campaign's packing (data.packing), or None for padded microbatches."""
    return Packing(campaign.data.max_length) if campaign.data.packing else None


def attention_of(model: Any) -> str:
    """How the model's attention takes a packed microbatch (see `attention_named`)."""
    config = getattr(getattr(model, "module", model), "config", None)  # DDP wraps the model
    return attention_named(getattr(config, "_attn_implementation", None))


def attention_named(implementation: str | None) -> str:
    """The attention kind ("flash", "eager" or "sdpa") of a transformers attention
    implementation's name (unset: transformers' default, SDPA)."""
    impl = str(implementation or "sdpa")
    return "flash" if "flash" in impl else "eager" if impl == "eager" else "sdpa"


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` grouped into rows of at most `capacity` tokens, as few padded
    tokens (rows x the widest row) as longest-first balancing finds: for each row count from
    the fewest that can hold the tokens up to one example per row (the padded microbatch's
    own cost, so packing never pads more), the examples go longest first to the least loaded
    row. A pure function of the lengths: ties go to the lower index, then to fewer rows."""
    if any(n > capacity for n in lengths):
        raise ValueError(f"an example of {max(lengths)} tokens is longer than a packed row of "
                         f"{capacity}: encode with data.max_length={capacity}")  # fmt: skip
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    best: tuple[int, list[list[int]]] | None = None
    for k in range(max(1, math.ceil(sum(lengths) / capacity)), len(lengths) + 1):
        loads = [0] * k
        rows: list[list[int]] = [[] for _ in range(k)]
        for i in order:
            r = min(range(k), key=lambda j: (loads[j], j))
            if loads[r] + lengths[i] > capacity:
                break
            loads[r] += lengths[i]
            rows[r].append(i)
        else:
            if best is None or k * max(loads) < best[0]:
                best = (k * max(loads), rows)
    return sorted(sorted(row) for row in best[1] if row) if best else []  # rows in data order


def row_spans(examples: Sequence[Encoded], packing: Packing) -> list[list[tuple[int, int, int]]]:
    """Where every example lies: per row, (example index, start, end) in row order. The one
    layout `collate_packed` builds and `data show --batch` shows."""
    rows = pack_rows([len(e.input_ids) for e in examples], packing.length)
    if packing.flatten:
        rows = [[i for row in rows for i in row]]
    out: list[list[tuple[int, int, int]]] = []
    for row in rows:
        at, spans = 0, []
        for i in row:
            spans.append((i, at, at + len(examples[i].input_ids)))
            at += len(examples[i].input_ids)
        out.append(spans)
    return out


def collate_packed(examples: Sequence[Encoded], pad_id: int, packing: Packing
                   ) -> dict[str, torch.Tensor]:  # fmt: skip
    """A causal-LM microbatch as packed rows: input_ids, position_ids, labels, and the
    block-diagonal causal mask (none when flattened for flash attention)."""
    import torch

    layout = row_spans(examples, packing)
    width = max(spans[-1][2] for spans in layout)
    ids = torch.full((len(layout), width), pad_id, dtype=torch.long)
    labels = torch.full((len(layout), width), IGNORE_INDEX, dtype=torch.long)
    positions = torch.zeros((len(layout), width), dtype=torch.long)
    segment = torch.zeros((len(layout), width), dtype=torch.long)
    for r, spans in enumerate(layout):
        for s, (i, start, end) in enumerate(spans):
            e = examples[i]
            if len(e.labels) != end - start:
                raise ValueError(f"example {e.example_id}: {len(e.labels)} labels for "
                                 f"{end - start} tokens; a causal LM needs one label per "
                                 "token")  # fmt: skip
            ids[r, start:end] = torch.tensor(e.input_ids, dtype=torch.long)
            # The first label stays IGNORE_INDEX: nothing before it in the example.
            labels[r, start + 1 : end] = torch.tensor(e.labels[1:], dtype=torch.long)
            positions[r, start:end] = torch.arange(end - start)
            segment[r, start:end] = s
        # The padding tail is a segment of its own, causal within itself: no query row is
        # fully masked (SDPA would give NaN there, and NaN times a zero gradient is NaN).
        at = spans[-1][2]
        positions[r, at:] = torch.arange(width - at)
        segment[r, at:] = len(spans)
    batch = {"input_ids": ids, "position_ids": positions, "labels": labels}
    if not packing.flatten:
        mask = block_causal_mask(segment)
        batch["attention_mask"] = as_additive(mask) if packing.attention == "eager" else mask
    return batch


def block_causal_mask(segment: torch.Tensor) -> torch.Tensor:
    """(rows, 1, width, width) boolean mask: query q sees key k when both lie in the same
    example and k <= q. transformers passes a 4D mask to attention as it is."""
    import torch

    width = segment.shape[1]
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    same = segment[:, :, None] == segment[:, None, :]
    return (same & causal)[:, None, :, :]


def as_additive(mask: torch.Tensor) -> torch.Tensor:
    """The boolean mask as eager attention adds it to the scores: 0 where seen, fp32's
    minimum where not (the scores are promoted to fp32 by the addition)."""
    import torch

    zero = torch.zeros((), dtype=torch.float32)
    return torch.where(mask, zero, torch.finfo(torch.float32).min)
