"""One dry-run measurement: build the model with n blocks on meta tensors, run every phase.

The model comes from `model.build` exactly as a run builds it (`build_from_config`, then
`apply_method` with its set-up checks), activation checkpointing from the same helper the loop
calls, the optimizer from `train.optimizer` and the loss from `train.batching`. Only what a meta
tensor cannot show is added, by name (see `tunepilot.sizing.dry_run.run`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from tunepilot.sizing.dry_run.attention import COUNTER, TARGET
from tunepilot.sizing.dry_run.config import ArchitectureConfig
from tunepilot.sizing.dry_run.shape import Shape
from tunepilot.sizing.phase_size import CUBLAS_WORKSPACE, PHASES, PhaseSize


@dataclass
class Measured:
    """Each phase of one n-block model, and its parameter counts."""

    phases: dict[str, PhaseSize]
    trainable: int
    total: int
    built: str  # the class the run builds (the task's head on the config's architecture)
    quantized: int = 0  # elements of the quantized frozen weights (nf4/int8 bases)
    trainable_bytes: int = 0  # the trained weights as stored (training.weights_dtype)


def build_meta_model(arch: ArchitectureConfig, shape: Shape, blocks: int) -> tuple[Any, Any]:
    """(model ready to train, LoadedModel) with `blocks` decoder blocks, on meta tensors."""
    from tunepilot.model.base import ModelSource
    from tunepilot.model.build import (
        apply_method,
        build_from_config,
        enable_activation_checkpointing,
    )

    source = ModelSource(arch.path, arch.source, None, None, {}, "local")
    from tunepilot.sizing.dry_run.attention import register_fused_attention

    TARGET["device"] = shape.device
    config = arch.with_layers(blocks)
    impl = "eager" if shape.attention == "eager" else register_fused_attention()
    settings = shape.settings.model_copy(update={"attn_implementation": impl})
    loaded = build_from_config(
        config, source, shape.kind, settings, shape.label_names, shape.base_dtype,
        pad_token_id=config.get("pad_token_id") or 0,
    )  # fmt: skip
    # a SetupFailure is bad input: exit 2, the key
    model = apply_method(loaded, settings, shape.training.weights_dtype)
    if shape.activation_checkpointing:
        enable_activation_checkpointing(model, context_fn=recompute_contexts(shape))
    model.train()
    return model, loaded


def measure_blocks(arch: ArchitectureConfig, shape: Shape, blocks: int) -> Measured:
    """Every phase of the model with `blocks` blocks, as live bytes and FLOPs."""
    from tunepilot.sizing.dry_run.optimizers import dry_run_optimizer, paged_bytes
    from tunepilot.sizing.dry_run.quant import QuantizedStorage
    from tunepilot.sizing.dry_run.tracker import StorageTracker, model_roles

    model, _ = build_meta_model(arch, shape, blocks)
    quant = QuantizedStorage.of(model, shape.base_dtype)
    tracker = StorageTracker()
    for name, param in model.named_parameters():
        tracker.track_sized(param, quant.bytes_of(name, param))
    tracker.track(model.buffers())
    optimizer = dry_run_optimizer(model, shape.training)
    extra = (
        {"cuBLAS workspace (CUDA, analytical)": CUBLAS_WORKSPACE} if shape.device == "cuda" else {}
    )
    extra |= quant.temporaries()
    phases: dict[str, PhaseSize] = {}
    with tracker:
        for name in PHASES[:2]:
            tracker.reset_peak()
            before = flops_now(tracker)
            train_step(model, optimizer, shape, tracker)
            roles = model_roles(tracker, model, optimizer)
            inputs = shape.inputs(shape.microbatch, shape.length)
            phases[name] = _phase(name, tracker.breakdown(roles), flops_now(tracker) - before,
                                  extra, inputs, quant.notes)  # fmt: skip
            phases[name].host_paged = paged_bytes(optimizer)
            optimizer.zero_grad(set_to_none=True)
        phases |= _forward_phase(
            "evaluation", model, optimizer, shape, tracker, extra,
            shape.eval_batch, shape.eval_length, quant.notes,
        )  # fmt: skip
        roles = model_roles(tracker, model, optimizer)
        resident = tracker.breakdown(roles, at_peak=False)
        phases["checkpoint"] = _phase(
            "checkpoint", resident, 0, {}, shape.inputs(0, 0),
            ["safetensors copies each tensor to host memory: the device holds what is "
             "resident (weights, optimizer state), nothing more (analytical)"],
        )  # fmt: skip
        phases |= _forward_phase(
            "export", model, optimizer, shape, tracker, extra, 1, shape.length,
            ["the adapter is written from host copies; the control outputs are one "
             "forward per example, sized at batch 1 x the longest length"],
        )  # fmt: skip
    trained = [p for p in model.parameters() if p.requires_grad]
    trainable = sum(p.numel() for p in trained)
    total = sum(p.numel() for p in model.parameters())
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return Measured(phases, trainable, total, type(base).__name__, quant.quantized_elements,
                    sum(p.numel() * p.element_size() for p in trained))


def make_batch(shape: Shape, batch: int, length: int, device: str = "meta",
               vocab: int = 2) -> dict[str, Any]:  # fmt: skip
    """Full-length rows of token ids (random on a real device) and their labels, the model's
    keyword arguments under "inputs"; an image campaign's pictures instead."""
    import torch

    if shape.image:
        from tunepilot.sizing.dry_run.images import image_batch

        return image_batch(shape.image, batch, device)
    ids = torch.randint(0, vocab, (batch, length), device=device)
    labels = ids if shape.kind == "causal_lm" else torch.zeros(batch, dtype=torch.long,
                                                                device=device)  # fmt: skip
    # Every row is full length, so the padding mask is all ones, which transformers drops
    # before attention; None says the same without a data-dependent check on meta tensors.
    return {"inputs": {"input_ids": ids, "attention_mask": None}, "labels": labels}


def flops_now(tracker: Any) -> Counter[str]:
    """FLOPs counted so far per compute precision: the tracker's and the attention stand-in's."""
    return tracker.flops_by + COUNTER


def step_autocast(shape: Shape, device: str) -> Any:
    """The forward's autocast context as the loop enters it (`train.precision`): on meta
    tensors `MetaAutocast` with the sized device's policy, on a real device torch's own."""
    import contextlib

    import torch

    if shape.training.precision == "fp32":
        return contextlib.nullcontext()
    if device == "meta":
        from tunepilot.sizing.dry_run.autocast import MetaAutocast

        return MetaAutocast(shape.training.precision, shape.device)
    from tunepilot.train.precision import autocast_and_scaler

    return autocast_and_scaler(shape.training.precision, torch.device(device))[0]()


def recompute_contexts(shape: Shape) -> Any:
    """`torch.utils.checkpoint`'s context_fn for a meta model: the recompute of each block
    runs under `MetaAutocast` when the forward did, as checkpoint re-enters torch's autocast
    (which a meta tensor does not see); None when there is no autocast to replay."""
    import contextlib

    if shape.training.precision == "fp32":
        return None

    def contexts() -> tuple[Any, Any]:
        return contextlib.nullcontext(), step_autocast(shape, "meta")

    return contexts


def train_step(
    model: Any, optimizer: Any, shape: Shape, tracker: Any, device: str = "meta", vocab: int = 2
) -> None:
    """One microbatch's forward (under the loop's autocast), loss, backward, clipping and
    optimizer step, as the loop runs them.

    The dry run runs it on meta tensors; `dry_run.check` runs it on real ones to compare.
    """
    from tunepilot.train.batching import summed_loss
    from tunepilot.train.loss import causal_lm_summed_loss
    from tunepilot.train.optimizer import update_norm

    tracker.region = "forward"
    batch = make_batch(shape, shape.microbatch, shape.length, device, vocab)
    if shape.kind == "causal_lm":  # the loop's chunked loss, its recompute under autocast
        loss = causal_lm_summed_loss(
            model, batch["inputs"], batch["labels"], chunks=shape.training.loss_chunks,
            autocast=lambda: step_autocast(shape, device), use_cache=False,
            context_fn=recompute_contexts(shape) if device == "meta" else None,
        )  # fmt: skip
    else:
        with step_autocast(shape, device):
            logits = model(**batch["inputs"]).logits
        loss = summed_loss(logits, batch["labels"], shape.kind)
        del logits
    loss = loss / max(batch["labels"].numel(), 1)
    tracker.region = "backward"
    loss.backward()
    del loss, batch
    tracker.region = "optimizer"
    params = [p for p in model.parameters() if p.requires_grad]
    update_norm(optimizer, params, shape.training.max_grad_norm)
    optimizer.step()  # nothing left to do when the step ran in backward
    tracker.region = "setup"


def _forward_phase(
    name: str, model: Any, optimizer: Any, shape: Shape, tracker: Any,
    extra: dict[str, int], batch_size: int, length: int, notes: list[str],
) -> dict[str, PhaseSize]:  # fmt: skip
    """No-grad forwards as evaluation (or export's control outputs) runs them.

    Evaluation computes the validation loss (the chunked loss of `train.loss`) and, for
    a generating task, then generates: a prefill that keeps only the last position's logits
    and a KV cache that grows by max_new_tokens. The phase's peak is the larger of the two
    passes; its FLOPs are both. Export's control outputs generate (or classify) only.
    """
    import torch

    generating = shape.generates
    passes = (["loss"] if name == "evaluation" else []) + (["prefill"] if generating else [])
    said = {"loss": "the validation-loss forward (chunked loss, each chunk in fp32)",
            "prefill": "the generation prefill and its KV cache",
            "forward": "the forward"}  # fmt: skip
    model.eval()
    out = {}
    with torch.no_grad():
        for kind in passes or ["forward"]:
            breakdown, count, terms = _one_pass(kind, model, optimizer, shape, tracker,
                                                batch_size, length)  # fmt: skip
            out[f"{name}:{kind}"] = _phase(name, breakdown, count, {**extra, **terms},
                                           shape.inputs(batch_size, length),
                                           [*notes, f"peak in {said[kind]}"])  # fmt: skip
    model.train()
    tracker.region = "setup"
    return out


def _one_pass(
    kind: str, model: Any, optimizer: Any, shape: Shape, tracker: Any, batch_size: int,
    length: int,
) -> tuple[Any, int, dict[str, int]]:  # fmt: skip
    """One forward pass's peak breakdown, FLOPs and added terms."""
    from tunepilot.sizing.dry_run.tracker import model_roles
    from tunepilot.train.batching import summed_loss
    from tunepilot.train.loss import causal_lm_summed_loss, eval_chunks

    tracker.reset_peak()
    tracker.region = "forward"
    before = flops_now(tracker)
    batch = make_batch(shape, batch_size, length)
    terms: dict[str, int] = {}
    if kind == "prefill":
        out = model(**batch["inputs"], use_cache=True, logits_to_keep=1)
        growth = _cache_bytes(out) * shape.training.max_new_tokens // max(length, 1)
        terms[f"KV cache growth over {shape.training.max_new_tokens} new tokens "
              "(analytical)"] = growth  # fmt: skip
    elif kind == "loss" and shape.kind == "causal_lm":  # evaluation's chunked loss
        chunks = eval_chunks(shape.training.loss_chunks, shape.microbatch, batch_size)
        out = causal_lm_summed_loss(model, batch["inputs"], batch["labels"], chunks=chunks,
                                    use_cache=False)  # fmt: skip
    else:
        out = model(**batch["inputs"], **({} if shape.image else {"use_cache": False}))
        if kind == "loss":
            loss = summed_loss(out.logits, batch["labels"], shape.kind)
            del loss
    breakdown = tracker.breakdown(model_roles(tracker, model, optimizer))
    del out, batch
    return breakdown, flops_now(tracker) - before, terms


def _cache_bytes(out: Any) -> int:
    from torch.utils._pytree import tree_leaves

    cache = getattr(out, "past_key_values", None)
    if cache is None:
        return 0
    layers = getattr(cache, "layers", None)
    tensors = (
        [
            t
            for layer in layers
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
        ]
        if layers is not None
        else tree_leaves(cache)
    )
    return sum(t.numel() * t.element_size() for t in tensors if hasattr(t, "numel"))


def _phase(
    name: str, breakdown: Any, flops: Counter[str] | int, extra: dict[str, int],
    inputs: dict[str, Any], notes: list[str],
) -> PhaseSize:  # fmt: skip
    """A PhaseSize whose temporaries include the named analytical terms; `flops` per compute
    precision (or 0 for a phase that computes nothing)."""
    parts = breakdown.as_dict()
    parts["temporaries"] += sum(extra.values())
    by = {k: int(v) for k, v in sorted(dict(flops or {}).items()) if v}
    return PhaseSize(name, **parts, peak=sum(parts.values()), flops=sum(by.values()),
                     inputs=inputs, notes=list(notes), analytical=dict(extra),
                     flops_by=by)  # fmt: skip
