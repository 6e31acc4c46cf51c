"""Attention on meta tensors, sized as the target GPU runs it.

On meta tensors PyTorch's `scaled_dot_product_attention` falls back to its math path (two
batched matmuls around a softmax), which keeps a B x H x L x L matrix per layer. On a CUDA GPU
the same call runs the flash or memory-efficient kernel, which keeps no L x L matrix: it saves
q, k, v, the output and a B x H x L fp32 log-sum-exp, and its backward allocates dq, dk, dv
plus an fp32 row statistic (delta, B x H x L) and an fp32 dq accumulator. `FUSED`, an
attention implementation registered with transformers, stands in for that kernel with exactly
those tensors, so the tracker sees what the GPU holds; its FLOPs are PyTorch's own SDPA
formulas (`torch.utils.flop_counter`), counted here because the stand-in computes nothing.

`eager` attention (transformers' own matmul-softmax-matmul) is not replaced: the meta run
executes it as is, and its L x L matrices are measured.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from tunepilot.sizing.dry_run.autocast import LOWER_NOW
from tunepilot.sizing.dry_run.tracker import precision_of

ATTENTION_KINDS = ("sdpa", "flash", "eager")

SENTENCES = {
    "sdpa": "attention sized as fused SDPA (flash / memory-efficient kernel on CUDA): saves "
    "q, k, v, output and a B x H x L fp32 log-sum-exp; no L x L matrix",
    "flash": "attention sized as flash-attention: saves q, k, v, output and a B x H x L fp32 "
    "log-sum-exp; no L x L matrix",
    "eager": "attention sized as eager (matmul, softmax, matmul): keeps the B x H x L x L "
    "scores and probabilities of every layer",
}


class _FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, counter: Counter[str]) -> Any:  # type: ignore[override]
        # The kernels write the output batch x length x heads x dim and return it transposed
        # (CUDA's flash and memory-efficient kernels always, CPU's when q is laid out so, as
        # transformers' q.view(...).transpose(1, 2) is): the caller's transpose back and
        # reshape are then views, not a copy the size of q per layer.
        b, h, length = q.shape[:-1]
        out = q.new_empty((b, length, h, v.shape[-1])).transpose(1, 2)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.counter = counter
        counter[precision_of(q.dtype)] += sdpa_flop_count(q.shape, k.shape, v.shape)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        ctx.counter[precision_of(q.dtype)] += sdpa_backward_flop_count(
            grad.shape, q.shape, k.shape, v.shape
        )
        delta = torch.empty_like(lse)  # noqa: F841 - rowsum(dO * O), held during the kernel
        dq_accum = torch.empty_like(q, dtype=torch.float32)  # noqa: F841
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


class _StandIn(TorchFunctionMode):
    """Inside one attention call: `F.scaled_dot_product_attention` becomes the fused kernel."""

    def __init__(self, counter: Counter[str]) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention and not (
            TARGET["device"] == "cpu" and kwargs.get("dropout_p", 0.0) > 0
        ):
            q, k, v = args[:3]
            if LOWER_NOW:  # under (meta) autocast the kernel gets half q, k, v, as autocast casts
                q, k, v = (LOWER_NOW[-1](t) for t in (q, k, v))
            return _FusedAttention.apply(q, k, v, self.counter)
        return func(*args, **kwargs)


FUSED = "tunepilot_fused_kernel"
"""Its name holds neither "sdpa" nor "flash": transformers would hold it to that backend's
support flags (Gemma 2 refuses SDPA, for its soft-cap, but runs flash-attention)."""
COUNTER: Counter[str] = Counter()
"""Attention FLOPs so far, per compute precision: the tracker cannot see the stand-in's."""
# The device sized. CPU's fused (flash) SDPA kernel refuses attention dropout, and PyTorch
# then runs the math path, L x L matrices included; CUDA's flash and memory-efficient
# kernels apply dropout inside the kernel.
TARGET = {"device": "cuda"}


def fused_attention_forward(module: Any, query: Any, key: Any, value: Any, *args: Any,
                            **kwargs: Any) -> Any:  # fmt: skip
    """transformers' own SDPA attention function, with the kernel replaced by its footprint.

    Registered as an attention implementation (transformers' `AttentionInterface`), so it runs
    as module code: also when activation checkpointing recomputes a block in backward. A
    logit soft-cap (Gemma 2) is dropped: the flash kernels apply it in place, at no memory.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kwargs.pop("softcap", None)
    with _StandIn(COUNTER):
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)


def register_fused_attention() -> str:
    """Register the stand-in with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(FUSED, fused_attention_forward)
    AttentionMaskInterface.register(FUSED, sdpa_mask)
    return FUSED
