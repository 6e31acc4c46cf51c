"""One dry-run measurement: build the model with n blocks on meta tensors, run every phase.

The model comes from `model.build` exactly as a run builds it (`build_from_config`, then
`apply_method` with its set-up checks), activation checkpointing from the same helper the loop
calls, the optimizer from `train.optimizer` and the loss from `train.batching`. Only what a meta
tensor cannot show is added, by name (see `tunepilot.sizing.dry_run`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tunepilot.errors import input_error
from tunepilot.sizing.dry_run_attention import COUNTER, TARGET
from tunepilot.sizing.dry_run_config import ArchitectureConfig
from tunepilot.sizing.phase_size import CUBLAS_WORKSPACE, PHASES, PhaseSize

if TYPE_CHECKING:
    from tunepilot.data.workspace import Workspace

_ATTENTION_OF = {None: "sdpa", "sdpa": "sdpa", "eager": "eager"}


@dataclass
class Shape:
    """Everything a measurement depends on, resolved from the campaign and the overrides."""

    settings: Any  # ModelSettings with base_dtype resolved
    training: Any  # TrainingSettings
    kind: str  # "classification" | "causal_lm" | "image_classification"
    generates: bool  # evaluation generates text (extraction, format)
    label_names: list[str] | None
    microbatch: int
    length: int
    eval_batch: int
    eval_length: int
    base_dtype: str
    activation_checkpointing: bool
    attention: str
    device: str
    notes: list[str] = field(default_factory=list)
    image: tuple[int, int, int] | None = None  # (channels, height, width) of an image input

    @classmethod
    def from_campaign(
        cls, ws: Workspace, arch: ArchitectureConfig, *, microbatch: int | None,
        max_length: int | None, activation_checkpointing: bool | None,
        base_dtype: str | None, attention: str | None, device: str,
    ) -> Shape:  # fmt: skip
        from tunepilot.model.base_dtype import BASE_DTYPES
        from tunepilot.sizing.dry_run_attention import ATTENTION_KINDS, SENTENCES

        c = ws.campaign
        t, m = c.training, c.model
        notes: list[str] = []
        dtype = base_dtype or m.base_dtype
        if dtype is None:
            dtype = "bf16" if device == "cuda" else "fp32"
            notes.append(f"model.base_dtype unset: sized as {dtype}, its default on {device}")
        if dtype not in BASE_DTYPES:
            raise input_error("base_dtype", f"`{dtype}` is not a base dtype",
                              f"use one of {', '.join(BASE_DTYPES)}")  # fmt: skip
        impl = m.attn_implementation
        attention = attention or (
            "flash" if impl and impl.startswith("flash") else _ATTENTION_OF.get(impl, "sdpa")
        )
        if attention not in ATTENTION_KINDS:
            raise input_error("attention", f"`{attention}` is not an attention kind",
                              f"use one of {', '.join(ATTENTION_KINDS)}")  # fmt: skip
        if device == "cpu" and attention == "flash":
            attention = "sdpa"
        on_cpu = " (CPU's fused SDPA kernel; with attention dropout CPU runs the math path, "
        on_cpu += "L x L matrices included)"
        notes.append(SENTENCES[attention] + (on_cpu if device == "cpu" else ""))
        task = c.hypothesis.task
        labels = c.data.labels
        if task in ("classification", "image_classification") and not labels:
            labels = ws.prepare(write=False, seal=False).label_names
        image = None
        if task == "image_classification":
            from tunepilot.sizing.dry_run_images import image_input

            image, said = image_input(ws, arch, list(labels or []))
            notes.append(said)
        length, eval_length = max_length or c.data.max_length, max_length or c.data.max_length
        longest = None if max_length or image else data_lengths(ws, arch)
        if image:
            length = eval_length = 0  # the picture's size is fixed by the processor
        elif longest:
            length, eval_length = longest
            notes.append(
                f"steps sized at {length} tokens, evaluation at {eval_length}: the longest "
                "training and validation examples encoded with the campaign's tokenizer "
                f"(capped at data.max_length={c.data.max_length})"
            )
        else:
            why = "asked for" if max_length else (
                "data.max_length, the longest a microbatch can be after truncation; no "
                "tokenizer here to measure the data's own lengths"
            )  # fmt: skip
            notes.append(f"sequences sized at {length} tokens ({why}); evaluation the same")
        if c.training.precision != "fp32":
            notes.append(
                f"training.precision={c.training.precision} autocast is not replayed on meta "
                f"tensors: activations are sized in the base's {dtype} compute dtype"
            )
        return cls(
            settings=m.model_copy(update={"base_dtype": dtype}),
            training=t,
            kind=task if task in ("classification", "image_classification") else "causal_lm",
            generates=task not in ("classification", "image_classification"),
            label_names=list(labels) if labels else None,
            microbatch=microbatch or t.microbatch,
            length=length,
            eval_batch=t.eval_batch_size,
            eval_length=eval_length,
            base_dtype=dtype,
            activation_checkpointing=(
                t.activation_checkpointing
                if activation_checkpointing is None
                else activation_checkpointing
            ),
            attention=attention,
            device=device,
            notes=notes,
            image=image,
        )

    def inputs(self, batch: int, length: int) -> dict[str, Any]:
        out = {
            "microbatch": batch, "length": length, "base_dtype": self.base_dtype,
            "activation_checkpointing": self.activation_checkpointing,
            "attention": self.attention, "device": self.device,
        }  # fmt: skip
        if self.image:  # a picture's size is the processor's, never a token count
            del out["length"]
            out["image"] = "x".join(map(str, self.image))
        return out


@dataclass
class Measured:
    """Each phase of one n-block model, and its parameter counts."""

    phases: dict[str, PhaseSize]
    trainable: int
    total: int


def build_meta_model(arch: ArchitectureConfig, shape: Shape, blocks: int) -> tuple[Any, Any]:
    """(model ready to train, LoadedModel) with `blocks` decoder blocks, on meta tensors."""
    from tunepilot.model.base import ModelSource
    from tunepilot.model.build import (
        apply_method,
        build_from_config,
        enable_activation_checkpointing,
    )

    source = ModelSource(arch.path, arch.source, None, None, {}, "local")
    from tunepilot.sizing.dry_run_attention import register_fused_attention

    TARGET["device"] = shape.device
    config = arch.with_layers(blocks)
    impl = "eager" if shape.attention == "eager" else register_fused_attention()
    settings = shape.settings.model_copy(update={"attn_implementation": impl})
    loaded = build_from_config(
        config, source, shape.kind, settings, shape.label_names, shape.base_dtype,
        pad_token_id=config.get("pad_token_id") or 0,
    )  # fmt: skip
    model = apply_method(loaded, settings)  # a SetupFailure is bad input: exit 2, the key
    if shape.activation_checkpointing:
        enable_activation_checkpointing(model)
    model.train()
    return model, loaded


def measure_blocks(arch: ArchitectureConfig, shape: Shape, blocks: int) -> Measured:
    """Every phase of the model with `blocks` blocks, as live bytes and FLOPs."""
    from tunepilot.sizing.dry_run_quant import QuantizedStorage
    from tunepilot.sizing.dry_run_tracker import StorageTracker, model_roles
    from tunepilot.train.optimizer import build_optimizer

    model, _ = build_meta_model(arch, shape, blocks)
    quant = QuantizedStorage.of(model, shape.base_dtype)
    tracker = StorageTracker()
    for name, param in model.named_parameters():
        tracker.track_sized(param, quant.bytes_of(name, param))
    tracker.track(model.buffers())
    optimizer = build_optimizer(model, shape.training, foreach=shape.device == "cuda")
    extra = (
        {"cuBLAS workspace (CUDA, analytical)": CUBLAS_WORKSPACE} if shape.device == "cuda" else {}
    )
    extra |= quant.temporaries()
    phases: dict[str, PhaseSize] = {}
    with tracker:
        for name in PHASES[:2]:
            tracker.reset_peak()
            flops0, attn0 = tracker.flops, COUNTER[0]
            train_step(model, optimizer, shape, tracker)
            roles = model_roles(tracker, model, optimizer)
            count = tracker.flops - flops0 + COUNTER[0] - attn0
            inputs = shape.inputs(shape.microbatch, shape.length)
            phases[name] = _phase(name, tracker.breakdown(roles), count, extra, inputs, quant.notes)
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
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return Measured(phases, trainable, total)


def make_batch(shape: Shape, batch: int, length: int, device: str = "meta",
               vocab: int = 2) -> dict[str, Any]:  # fmt: skip
    """Full-length rows of token ids (random on a real device) and their labels, the model's
    keyword arguments under "inputs"; an image campaign's pictures instead."""
    import torch

    if shape.image:
        from tunepilot.sizing.dry_run_images import image_batch

        return image_batch(shape.image, batch, device)
    ids = torch.randint(0, vocab, (batch, length), device=device)
    labels = ids if shape.kind == "causal_lm" else torch.zeros(batch, dtype=torch.long,
                                                                device=device)  # fmt: skip
    # Every row is full length, so the padding mask is all ones, which transformers drops
    # before attention; None says the same without a data-dependent check on meta tensors.
    return {"inputs": {"input_ids": ids, "attention_mask": None}, "labels": labels}


def train_step(
    model: Any, optimizer: Any, shape: Shape, tracker: Any, device: str = "meta", vocab: int = 2
) -> None:
    """One microbatch's forward, loss, backward, clipping and optimizer step, as the loop.

    The dry run runs it on meta tensors; `dry_run_check` runs it on real ones to compare.
    """
    import math

    import torch

    from tunepilot.train.batching import summed_loss

    tracker.region = "forward"
    batch = make_batch(shape, shape.microbatch, shape.length, device, vocab)
    logits = model(**batch["inputs"]).logits
    loss = summed_loss(logits, batch["labels"], shape.kind) / max(batch["labels"].numel(), 1)
    del logits
    tracker.region = "backward"
    loss.backward()
    del loss, batch
    tracker.region = "optimizer"
    params = [p for p in model.parameters() if p.requires_grad]
    torch.nn.utils.clip_grad_norm_(params, shape.training.max_grad_norm or math.inf)
    optimizer.step()
    tracker.region = "setup"


def _forward_phase(
    name: str, model: Any, optimizer: Any, shape: Shape, tracker: Any,
    extra: dict[str, int], batch_size: int, length: int, notes: list[str],
) -> dict[str, PhaseSize]:  # fmt: skip
    """No-grad forwards as evaluation (or export's control outputs) runs them.

    Evaluation computes the validation loss (full logits, cast to fp32 for the loss) and, for
    a generating task, then generates: a prefill that keeps only the last position's logits
    and a KV cache that grows by max_new_tokens. The phase's peak is the larger of the two
    passes; its FLOPs are both. Export's control outputs generate (or classify) only.
    """
    import torch

    generating = shape.generates and shape.kind == "causal_lm"
    passes = (["loss"] if name == "evaluation" else []) + (["prefill"] if generating else [])
    said = {"loss": "the validation-loss forward (full logits in fp32)",
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
    from tunepilot.sizing.dry_run_tracker import model_roles
    from tunepilot.train.batching import summed_loss

    tracker.reset_peak()
    tracker.region = "forward"
    flops0, attn0 = tracker.flops, COUNTER[0]
    batch = make_batch(shape, batch_size, length)
    terms: dict[str, int] = {}
    if kind == "prefill":
        out = model(**batch["inputs"], use_cache=True, logits_to_keep=1)
        growth = _cache_bytes(out) * shape.training.max_new_tokens // max(length, 1)
        terms[f"KV cache growth over {shape.training.max_new_tokens} new tokens "
              "(analytical)"] = growth  # fmt: skip
    else:
        out = model(**batch["inputs"], **({} if shape.image else {"use_cache": False}))
        if kind == "loss":
            loss = summed_loss(out.logits, batch["labels"], shape.kind)
            del loss
    breakdown = tracker.breakdown(model_roles(tracker, model, optimizer))
    del out, batch
    return breakdown, tracker.flops - flops0 + COUNTER[0] - attn0, terms


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
    name: str, breakdown: Any, flops: int, extra: dict[str, int], inputs: dict[str, Any],
    notes: list[str],
) -> PhaseSize:  # fmt: skip
    """A PhaseSize whose temporaries include the named analytical terms."""
    parts = breakdown.as_dict()
    parts["temporaries"] += sum(extra.values())
    return PhaseSize(name, **parts, peak=sum(parts.values()), flops=int(flops), inputs=inputs,
                     notes=list(notes), analytical=dict(extra))  # fmt: skip


def data_lengths(ws: Workspace, arch: ArchitectureConfig) -> tuple[int, int] | None:
    """(longest training, longest validation) example in tokens with the campaign's own
    tokenizer, capped at data.max_length; None when the architecture comes without one."""
    if arch.tokenizer_dir is None:
        return None
    from tunepilot.model.base import ModelSource
    from tunepilot.model.processors import load_tokenizer
    from tunepilot.tasks import make_encoder

    source = ModelSource(arch.tokenizer_dir, str(arch.tokenizer_dir), None, None, {}, "local")
    tokenizer = load_tokenizer(source, ws.campaign.model.trust_remote_code)
    prepared = ws.prepare(write=False, seal=False)
    encoder = make_encoder(ws.campaign, tokenizer, prepared.label_names, ws.root)

    def longest(split: str) -> int:
        return max((len(encoder.encode(e).input_ids) for e in prepared.splits.get(split, [])),
                   default=0)  # fmt: skip

    train, validation = longest("train"), longest("validation")
    if not train:
        return None
    return train, validation or train
