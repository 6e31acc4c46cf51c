"""The causal-LM loss where it counts, in chunks: no `(tokens x vocab)` tensor of a microbatch.

A causal LM's head is the widest layer there is (128k outputs for Llama 3), and the loss over
it used to be the largest tensor of the step: the full bf16 logits, their fp32 upcast, a
shifted slice and its copy, all kept for backward. Here instead:

* the model runs up to its final hidden states: a forward pre-hook on the output embedding
  (`get_output_embeddings()`, found through peft and DDP wrappers) captures the head's input
  and hands the head only the last position, so the model's own logits are `(batch x 1 x
  vocab)`; the forward still goes through every wrapper's own `forward` (DDP, FSDP2 and
  activation checkpointing see a normal call);
* the LABELS are shifted (position t predicts label t+1), never the logits, and only the
  positions whose shifted label carries loss are gathered: prompt and padding positions never
  reach the head;
* tunepilot applies the head itself, chunk by chunk: each chunk's logits are upcast to fp32
  on their own, and under autograd each chunk runs inside `torch.utils.checkpoint`, so its
  logits are recomputed in backward instead of kept. Calling the head module (not its weight)
  keeps LoRA on `lm_head` and tied embeddings working.

The result is the SUM of the cross-entropy (S2): the loop divides by `count_targets` of the
whole update, the one denominator. On CUDA a fused kernel library may replace the chunks
(`training.loss_kernel`: liger-kernel's fused linear cross-entropy, cut-cross-entropy); it
needs a plain linear head and is used only where it is importable and the tensors are on CUDA.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tunepilot.errors import InputError, Problem
from tunepilot.tasks.base import IGNORE_INDEX
from tunepilot.train.checkpoint import unwrap  # the module under DDP's wrapper

if TYPE_CHECKING:
    import torch

KERNEL_MODULES = {"liger": "liger_kernel", "cut_cross_entropy": "cut_cross_entropy"}
"""`training.loss_kernel` -> the module that provides it (pip names: liger-kernel,
cut-cross-entropy)."""
KERNEL_PACKAGES = {"liger": "liger-kernel", "cut_cross_entropy": "cut-cross-entropy"}


def check_kernel(kernel: str) -> None:
    """Refuse a selected kernel library that is not installed (exit 2, the key and the fix)."""
    module = KERNEL_MODULES.get(kernel)
    if module is not None and importlib.util.find_spec(module) is None:
        raise InputError(
            [Problem("training.loss_kernel", f"{kernel!r} is selected but {module} is not "
                     "installed", f"pip install {KERNEL_PACKAGES[kernel]}, or set "
                     "training.loss_kernel: plain")],
            title="the loss kernel is not installed",
        )  # fmt: skip


def kernel_that_runs(kernel: str, device_type: str) -> str:
    """Which loss implementation a run on `device_type` uses: a selected kernel library on
    CUDA, the plain chunked loss elsewhere (recorded in the run's env)."""
    check_kernel(kernel)
    return kernel if kernel != "plain" and device_type == "cuda" else "plain"


MIN_EVAL_CHUNK_POSITIONS = 512
"""Without gradients (evaluation) a chunk never holds fewer loss positions than this: its
logits stay small (512 x 128k vocabulary is 256 MiB in fp32) while the chunks of a large eval
batch over short rows stay few enough that the per-chunk Python overhead does not dominate
(4096 chunks of 16 positions would). Applied to the positions a batch really has
(`chunked_head_loss`), not to its padded size."""


def eval_chunks(loss_chunks: int, microbatch: int, eval_batch: int) -> int:
    """Chunks of an evaluation batch: as many as make each about a training chunk's size, so
    evaluation's loss never holds more of the vocabulary-wide logits than a training step
    (`chunked_head_loss` then keeps each at MIN_EVAL_CHUNK_POSITIONS or more)."""
    return loss_chunks * max(1, -(-eval_batch // max(microbatch, 1)))


def output_head(model: Any) -> Any:
    """The module that maps final hidden states to the vocabulary (LoRA-wrapped if LoRA
    targets it; its weight is the input embedding's when they are tied)."""
    head = unwrap(model).get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(unwrap(model)).__name__} has no output embedding to apply")
    return head


@contextlib.contextmanager
def captured_hidden(model: Any) -> Iterator[dict[str, Any]]:
    """Inside the block, a forward of `model` stores the head's input under "hidden" and its
    head computes the last position only (what a caller of the model's logits never reads)."""
    box: dict[str, Any] = {}

    def pre_hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            box["hidden"] = args[0]
            return (args[0][..., -1:, :], *args[1:]), kwargs
        name = next(iter(kwargs))  # the head called by keyword: its one input
        box["hidden"] = kwargs[name]
        return args, {**kwargs, name: kwargs[name][..., -1:, :]}

    handle = output_head(model).register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        yield box
    finally:
        handle.remove()


def loss_positions(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[Any, Any]:
    """(hidden states of the positions that carry loss, their next-token targets).

    The labels are shifted left by one (the last position predicts nothing); the logits are
    never sliced. On meta tensors (the dry run) every row is a full-length answer, so every
    position but the last carries loss, without a data-dependent mask."""
    width = hidden.shape[-1]
    if labels.device.type == "meta":
        return hidden[:, :-1].reshape(-1, width), labels[:, 1:].reshape(-1)
    import torch

    shifted = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
    keep = shifted != IGNORE_INDEX
    return hidden[keep], shifted[keep]


def logit_transform(model: Any) -> Callable[[Any], Any] | None:
    """What a model does to its head's output before returning logits, for the families that
    do something (Gemma 2+'s final soft-capping, Cohere's `logit_scale`, Granite's
    `logits_scaling`), applied by tunepilot after the fp32 upcast; None: nothing.
    `check_head` proves on every forward that the logits come out as the model's own."""
    inner = unwrap(model)
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    config = getattr(inner, "config", None)
    cap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(inner, "logit_scale", None)
    divide = getattr(config, "logits_scaling", None)
    if not cap and not isinstance(scale, (int, float)) and not divide:
        return None

    def transform(logits: Any) -> Any:
        import torch

        if isinstance(scale, (int, float)):
            logits = logits * scale
        if divide:
            logits = logits / divide
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return transform


def check_head(model: Any, out: Any, hidden: Any, post: Callable[[Any], Any] | None) -> None:
    """The model's own logits of the last position (what it computed in the forward) against
    tunepilot's head on the same hidden state: a model that does more after its head than
    `logit_transform` knows is refused, never trained on another loss."""
    import torch

    logits = getattr(out, "logits", None)
    if logits is None or hidden.device.type == "meta" or logits.shape[-2] != 1:
        return
    head = output_head(model)
    if head.training and any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in head.modules()):
        return  # a LoRA dropout on the head draws its own mask: nothing to compare with
    with torch.no_grad():
        mine = head(hidden[..., -1:, :]).float()
        mine = post(mine) if post is not None else mine
        theirs = logits.float()
        if not bool(torch.isfinite(theirs).all()):
            return  # a diverged model: the loop reports the non-finite loss itself
        tol = 1e-3 * max(1.0, float(theirs.abs().max()))
        if mine.shape != theirs.shape or not torch.allclose(mine, theirs, rtol=1e-3, atol=tol):
            raise ValueError(
                f"{type(unwrap(model)).__name__}: tunepilot's chunked loss does not reproduce "
                "the model's logits from its output embedding (a transform after the head "
                "that train/loss.py does not know); report it with the model's name"
            )


def _chunk_sum(head: Any, hidden: torch.Tensor, targets: torch.Tensor,
               post: Callable[[Any], Any] | None = None) -> torch.Tensor:  # fmt: skip
    import torch.nn.functional as F

    logits = head(hidden).float()
    return F.cross_entropy(post(logits) if post is not None else logits, targets,
                           reduction="sum")  # fmt: skip


def chunked_head_loss(
    head: Any, hidden: torch.Tensor, targets: torch.Tensor, chunks: int,
    context_fn: Callable[[], tuple[Any, Any]] | None = None,
    post: Callable[[Any], Any] | None = None,
) -> torch.Tensor:  # fmt: skip
    """Sum of cross-entropy of `head(hidden)` against `targets`, `chunks` pieces at a time,
    each recomputed in backward (never kept) when gradients are on."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if hidden.shape[0] == 0:  # nothing carries loss: a zero that still reaches the head
        return _chunk_sum(head, hidden.new_zeros(1, hidden.shape[-1]), targets.new_zeros(1),
                          post) * 0  # fmt: skip
    grad = torch.is_grad_enabled() and hidden.requires_grad
    if not grad:  # nothing is recomputed: only each chunk's logits size matters
        chunks = min(chunks, max(1, -(-hidden.shape[0] // MIN_EVAL_CHUNK_POSITIONS)))
    total: Any = None
    for part in torch.arange(hidden.shape[0], device="cpu").tensor_split(chunks):
        if part.numel() == 0:
            continue
        start, stop = int(part[0]), int(part[-1]) + 1
        h, y = hidden[start:stop], targets[start:stop]
        if grad:
            extra = {"context_fn": context_fn} if context_fn is not None else {}
            # the recompute replays the RNG (a LoRA dropout on the head draws the same mask);
            # meta tensors have no generator to replay
            piece = checkpoint(_chunk_sum, head, h, y, post, use_reentrant=False,
                               preserve_rng_state=h.device.type != "meta", **extra)  # fmt: skip
        else:
            piece = _chunk_sum(head, h, y, post)
        total = piece if total is None else total + piece
    return total


def _kernel_loss(kernel: str, head: Any, hidden: torch.Tensor, targets: torch.Tensor) -> Any:
    """A fused head + cross-entropy from a kernel library (CUDA), summed like the plain one."""
    import torch

    if type(head) is not torch.nn.Linear:
        raise InputError(
            [Problem("training.loss_kernel", f"{kernel!r} needs a plain linear head, found "
                     f"{type(head).__name__} (LoRA or modules_to_save on the head?)",
                     "set training.loss_kernel: plain")],
            title="the loss kernel cannot apply this head",
        )  # fmt: skip
    if kernel == "liger":  # its module API: the same call across liger-kernel releases
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        loss = LigerFusedLinearCrossEntropyLoss(reduction="sum")
        return loss(head.weight, hidden, targets, head.bias)
    from cut_cross_entropy import linear_cross_entropy

    extra = {"bias": head.bias} if head.bias is not None else {}
    return linear_cross_entropy(hidden, head.weight, targets, reduction="sum", **extra)


def causal_lm_summed_loss(
    model: Any, inputs: dict[str, Any], labels: torch.Tensor, *, chunks: int,
    kernel: str = "plain", autocast: Callable[[], Any] = contextlib.nullcontext,
    context_fn: Callable[[], tuple[Any, Any]] | None = None, **forward: Any,
) -> torch.Tensor:  # fmt: skip
    """Forward `model` on `inputs` and return the summed next-token cross-entropy over the
    positions whose shifted label carries loss (the count `count_targets` gives).

    `autocast` is the loop's forward context: the head runs under it as the model's own head
    would. `kernel` is the implementation that runs (`kernel_that_runs`), `context_fn` the
    recompute context of the dry run's meta autocast."""
    with autocast():
        with captured_hidden(model) as box:
            out = model(**inputs, **forward)
        captured = box.pop("hidden")
        post = logit_transform(model)
        check_head(model, out, captured, post)
        del out
        hidden, targets = loss_positions(captured, labels.to(captured.device))
        head = output_head(model)
        if kernel != "plain" and hidden.is_cuda and hidden.shape[0] > 0 and post is None:
            return _kernel_loss(kernel, head, hidden, targets)
        return chunked_head_loss(head, hidden, targets, chunks, context_fn, post)

