"""What a dry run sizes: the campaign's step shape, resolved once (`Shape`).

The microbatch, the sequence lengths, the base dtype, activation checkpointing, attention as
the target backend runs it, the training precision, and the device sized. Every choice is
noted in a sentence, and a length beyond the model's position table is bad input.

Lengths are the data's own (`Lengths`): every example encoded with the target's tokenizer
where its config folder has one, else with the campaign's own tokenizer (the model the
campaign file names, before a command-line `model.name_or_path=` swaps the architecture) as a
stated proxy, else data.max_length with the caveat that everything is an upper bound. Steps
are sized at the longest training example, evaluation at the longest validation or test
example (S4); hours use the mean padded length a microbatch really has under the campaign's
batching (`train.batching.UpdateSampler`, length bucketing included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tunepilot.errors import input_error
from tunepilot.sizing.dry_run.config import ArchitectureConfig

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
    lengths: Lengths | None = None  # the data's token lengths, when a tokenizer measured them

    @classmethod
    def from_campaign(
        cls, ws: Workspace, arch: ArchitectureConfig, *, microbatch: int | None,
        max_length: int | None, activation_checkpointing: bool | None,
        base_dtype: str | None, attention: str | None, device: str,
    ) -> Shape:  # fmt: skip
        from tunepilot.model.base_dtype import BASE_DTYPES
        from tunepilot.sizing.dry_run.attention import ATTENTION_KINDS, SENTENCES
        from tunepilot.train.precision import resolve_precision

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
        task = c.hypothesis.task
        classifies = task in ("classification", "image_classification")
        kind = task if classifies else "causal_lm"
        if attention == "sdpa" and impl in (None, "sdpa") and not _has_sdpa(arch, kind):
            attention = _no_sdpa(arch, kind, impl, notes)
        on_cpu = " (CPU's fused SDPA kernel; with attention dropout CPU runs the math path, "
        on_cpu += "L x L matrices included)"
        notes.append(SENTENCES[attention] + (on_cpu if device == "cpu" and attention == "sdpa"
                                             else ""))  # fmt: skip
        labels = c.data.labels
        if classifies and not labels:
            labels = ws.preview.label_names
        image = None
        if task == "image_classification":
            from tunepilot.sizing.dry_run.images import image_input

            image, said = image_input(ws, arch, list(labels or []))
            notes.append(said)
        length, eval_length = max_length or c.data.max_length, max_length or c.data.max_length
        if not image:
            _within_positions(arch, length, "max_length" if max_length else "data.max_length")
        lengths = None if max_length or image else data_lengths(ws, arch)
        if image:
            length = eval_length = 0  # the picture's size is fixed by the processor
        elif lengths:
            length, eval_length = lengths.longest_train, lengths.longest_eval
            notes.append(
                f"steps sized at {length} tokens, evaluation at {eval_length}: the longest "
                f"training and validation/test examples encoded with {lengths.source} "
                f"(capped at data.max_length={c.data.max_length}); hours at the mean padded "
                f"length of a training microbatch, {lengths.mean_train:.0f} tokens per example"
            )
        if c.data.packing and kind == "causal_lm" and not max_length:
            # Packed rows (train/packing.py): m examples in at most m rows, each no wider
            # than the widest row the epoch packs at the campaign's microbatch, else than
            # data.max_length (another m packs other rows).
            measured = lengths is not None and microbatch in (None, t.microbatch)
            length = lengths.widest_packed if measured else c.data.max_length  # type: ignore[union-attr]
            where = "the widest row the first epoch packs" if measured else "data.max_length"
            notes.append(
                f"data.packing: a microbatch of m examples packs into at most m rows "
                f"(train/packing.py, the loop's own code), so steps are sized at m rows of "
                f"{length} tokens ({where}); the block mask (m x L x L booleans) is not in "
                "the sized peak"
            )  # fmt: skip
        elif not lengths and not image:
            why = "asked for" if max_length else (
                "data.max_length, the longest a microbatch can be after truncation; no "
                "tokenizer here to measure the data's own lengths, so memory and hours are an "
                "UPPER BOUND"
            )  # fmt: skip
            notes.append(f"sequences sized at {length} tokens ({why}); evaluation the same")
        precision, said = resolve_precision(t.precision, device, bf16_supported=True)
        if t.precision is None:
            notes.append(f"{said} (sized for a card with bf16)")
            t = t.model_copy(update={"precision": precision})
        if t.precision != "fp32":
            notes.append(
                f"training.precision={t.precision}: the forward sized with the casts "
                f"torch.autocast makes on {device} (its operator lists, replayed on meta "
                "tensors); evaluation without autocast, as evaluate runs it"
            )
        return cls(
            settings=m.model_copy(update={"base_dtype": dtype}),
            training=t,
            kind=kind,
            generates=not classifies,
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
            lengths=lengths,
        )

    def inputs(self, batch: int, length: int) -> dict[str, Any]:
        out = {
            "microbatch": batch, "length": length, "base_dtype": self.base_dtype,
            "precision": self.training.precision,
            "activation_checkpointing": self.activation_checkpointing,
            "attention": self.attention, "device": self.device,
        }  # fmt: skip
        if self.image:  # a picture's size is the processor's, never a token count
            del out["length"]
            out["image"] = "x".join(map(str, self.image))
        return out


@dataclass(frozen=True)
class Lengths:
    """The data's token lengths as the campaign encodes them (capped at data.max_length)."""

    longest_train: int
    longest_eval: int  # the longest validation or test example
    mean_train: float  # mean padded length per example of a training microbatch
    mean_eval: float  # mean length of a validation example
    source: str  # which tokenizer measured them, in words
    widest_packed: int = 0  # with data.packing: the widest packed row of the first epoch


def data_lengths(ws: Workspace, arch: ArchitectureConfig) -> Lengths | None:
    """The data's lengths with the target's tokenizer, else the campaign's own as a proxy;
    None when neither is there (then data.max_length is sized, an upper bound)."""
    tokenizer_dir, source = arch.tokenizer_dir, "the target's own tokenizer"
    if tokenizer_dir is None:
        tokenizer_dir, name = _campaign_tokenizer(ws, arch)
        source = f"the campaign's own tokenizer ({name}) as a PROXY for the target's"
    if tokenizer_dir is None:
        return None
    t = ws.campaign.training
    key = ("lengths", str(tokenizer_dir), ws.campaign.data.max_length, t.microbatch,
           t.bucket_by_length, t.seed, ws.campaign.data.packing)  # fmt: skip
    if key not in ws.memo:
        ws.memo[key] = _measured_lengths(ws, tokenizer_dir, source)
    return ws.memo[key]


def _campaign_tokenizer(ws: Workspace, arch: ArchitectureConfig) -> tuple[Any, str]:
    """(folder, name) of the tokenizer of the model the campaign file itself names, when a
    command-line override swapped the architecture for one without a tokenizer."""
    from tunepilot.campaign import load_campaign
    from tunepilot.errors import InputError
    from tunepilot.sizing.dry_run.config import architecture_config

    kept = [o for o in ws.overrides if not o.startswith("model.name_or_path=")]
    if len(kept) == len(ws.overrides):
        return None, ""
    try:
        own = load_campaign(ws.campaign_file, kept).model
        found = architecture_config(own, ws.root)
    except InputError:
        return None, ""
    if found.tokenizer_dir is None or found.path == arch.path:
        return None, ""
    return found.tokenizer_dir, own.name_or_path


def _measured_lengths(ws: Workspace, tokenizer_dir: Any, source: str) -> Lengths | None:
    from tunepilot.model.base import ModelSource
    from tunepilot.model.processors import load_tokenizer
    from tunepilot.tasks import make_encoder
    from tunepilot.train.batching import UpdateSampler

    src = ModelSource(tokenizer_dir, str(tokenizer_dir), None, None, {}, "local")
    tokenizer = load_tokenizer(src, ws.campaign.model.trust_remote_code)
    prepared = ws.preview
    encoder = make_encoder(ws.campaign, tokenizer, prepared.label_names, ws.root)

    def lengths(split: str) -> list[int]:
        return [len(encoder.encode(e).input_ids) for e in prepared.splits.get(split, [])]

    train, validation, test = lengths("train"), lengths("validation"), lengths("test")
    if not train:
        return None
    t = ws.campaign.training
    sampler = UpdateSampler(train, t.microbatch, 1, seed=t.seed, drop_last=t.drop_last,
                            bucket_by_length=t.bucket_by_length)  # fmt: skip
    batches = [mb for i in range(sampler.plan.updates_per_epoch)
               for mb in sampler.global_update(0, i)]  # the first epoch as training batches it
    widest = 0
    if ws.campaign.data.packing and not ws.campaign.hypothesis.is_classification:
        from tunepilot.train.packing import pack_rows  # the loop's own packing

        padded = 0
        for mb in batches:
            loads = [sum(train[mb[i]] for i in row)
                     for row in pack_rows([train[i] for i in mb], ws.campaign.data.max_length)]
            padded, widest = padded + len(loads) * max(loads), max(widest, *loads)
    else:
        padded = sum(len(mb) * max(train[i] for i in mb) for mb in batches)
    examples = sum(len(mb) for mb in batches)
    mean = padded / examples if examples else max(train)  # no full microbatch: the longest
    evaluated = validation or train
    return Lengths(max(train), max([*evaluated, *test]), mean, sum(evaluated) / len(evaluated),
                   source, widest or max(train))  # fmt: skip


def _within_positions(arch: ArchitectureConfig, length: int, key: str) -> None:
    """A length beyond the model's position table is bad input, as `validate` says for a
    local model folder (S6): learned positions crash, rotary ones run where the model was
    never trained. A config with rope_scaling states its own range: the audit warns there."""
    from tunepilot.campaign.checks import position_limit

    found = position_limit(arch.config)
    if found is None or arch.config.get("rope_scaling") or length <= found[1]:
        return
    raise input_error(
        key,
        f"{length} tokens is beyond the model's {found[0]} {found[1]} ({arch.path}): a longer "
        "input crashes the run (learned positions) or runs where the model was never trained "
        "(rotary)",
        f"set {key} to at most {found[1]}",
        title="sequence longer than the model",
    )


def _model_class(arch: ArchitectureConfig, kind: str) -> Any:
    """The transformers class a run builds for this config and task, or None if none."""
    from transformers import CONFIG_MAPPING

    from tunepilot.model.build import auto_class

    auto = auto_class(kind)  # type: ignore[arg-type]
    try:
        return auto._model_mapping[CONFIG_MAPPING[str(arch.config["model_type"])]]
    except KeyError:
        return None  # building reports an architecture without this task as bad input


def _has_sdpa(arch: ArchitectureConfig, kind: str) -> bool:
    return bool(getattr(_model_class(arch, kind), "_supports_sdpa", True))


def _no_sdpa(arch: ArchitectureConfig, kind: str, impl: str | None, notes: list[str]) -> str:
    """A model without SDPA attention (Gemma 2: its logit soft-cap): transformers runs it
    eager when model.attn_implementation is unset, and refuses an explicit sdpa."""
    import transformers

    name = getattr(_model_class(arch, kind), "__name__", arch.architecture)
    if impl == "sdpa":
        raise input_error(
            "model.attn_implementation",
            f"sdpa: {name} has no SDPA attention in transformers {transformers.__version__}",
            "set model.attn_implementation to eager, or flash_attention_2 on a GPU with flash-attn",
            title="attention not available",
        )
    notes.append(
        f"{name} has no SDPA attention in transformers {transformers.__version__}: with "
        "model.attn_implementation unset a run uses eager attention, sized so "
        "(flash_attention_2 keeps no L x L matrix)"
    )
    return "eager"
