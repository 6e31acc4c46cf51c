"""The parameters that are trained (P1-P3): load the base, adapt it, and prove what moves.

- `load_model` loads a resolved base for sequence classification or causal LM, safetensors
  only, remote code only when the campaign trusts it, and records which weights were newly
  initialised (a fresh classification head is random and *must* be trained).
- `apply_method` makes it full fine-tuning or LoRA. Two silent mistakes are stopped here with a
  `SetupFailure` (a FAIL finding and its fix): a `target_modules` pattern that matches nothing
  (peft stays silent when another pattern matches), and a new head left frozen (random logits
  forever, while the loss still goes down a little through the adapters).

What trains and whether exactly that moves (P2, P3) lives in `tunepilot.model.params`.

torch, transformers and peft are imported inside the functions: only commands that train
import this module's heavy side.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

from tunepilot.campaign import ModelSettings
from tunepilot.errors import InputError, Problem, input_error
from tunepilot.model.activation_checkpointing import enable_activation_checkpointing
from tunepilot.model.base import ModelSource
from tunepilot.model.processors import quiet_transformers
from tunepilot.model.setup_checks import (
    check_new_head_trainable,
    check_target_modules,
    linear_module_names,
)
from tunepilot.model.setup_failure import SetupFailure
from tunepilot.verdict import Verdict

__all__ = [
    "AUTO_CLASSES", "LoadedModel", "SetupFailure", "apply_method", "auto_class",
    "build_from_config", "check_new_head_trainable", "check_target_modules",
    "enable_activation_checkpointing", "linear_module_names", "load_model",
]  # fmt: skip

ModelKind = Literal["classification", "causal_lm", "image_classification"]


AUTO_CLASSES: dict[str, str] = {
    "classification": "AutoModelForSequenceClassification",
    "causal_lm": "AutoModelForCausalLM",
    "image_classification": "AutoModelForImageClassification",
}
"""The transformers Auto class per model kind; export writes the same name into bundle.json."""
PEFT_TASK_TYPES = {"classification": "SEQ_CLS", "causal_lm": "CAUSAL_LM"}


@dataclass
class LoadedModel:
    """A loaded base and what loading found. `new_keys` are parameters that were not in the
    checkpoint (randomly initialised); `new_head_modules` the modules that own them."""

    model: Any
    source: ModelSource
    task_kind: ModelKind
    notes: list[str] = field(default_factory=list)
    new_head_modules: list[str] = field(default_factory=list)
    new_keys: list[str] = field(default_factory=list)
    checkpoint_labels: list[str] | None = None  # the checkpoint's own id2label, if named (D6)
    base_dtype: str = "fp32"  # model.base_dtype as resolved when the base was built


def _checkpoint_labels(config: Any) -> list[str] | None:
    """The label names a checkpoint's config carries, None when they are transformers' defaults."""
    id2label = getattr(config, "id2label", None) or {}
    names = [str(id2label[k]) for k in sorted(id2label, key=int)]
    if not names or all(n == f"LABEL_{i}" for i, n in enumerate(names)):
        return None
    return names


def auto_class(task_kind: ModelKind) -> Any:
    """transformers' Auto class a run of this task kind builds its model with."""
    import transformers

    return getattr(transformers, AUTO_CLASSES[task_kind])


def _build_kwargs(
    settings: ModelSettings, task_kind: ModelKind, label_names: list[str] | None, base_dtype: str
) -> dict[str, Any]:
    """What a base is built with, the same for a loaded and a config-only (meta) model."""
    from tunepilot.model.base_dtype import torch_dtype

    kwargs: dict[str, Any] = {
        "dtype": torch_dtype(base_dtype),
        "trust_remote_code": settings.trust_remote_code,
    }
    if settings.attn_implementation:
        kwargs["attn_implementation"] = settings.attn_implementation
    if task_kind != "causal_lm":
        if not label_names:
            raise ValueError("classification needs label_names in the campaign's id order")
        kwargs |= {
            "num_labels": len(label_names),
            "id2label": dict(enumerate(label_names)),
            "label2id": {name: i for i, name in enumerate(label_names)},
        }
    return kwargs


def load_model(
    source: ModelSource,
    task_kind: ModelKind,
    settings: ModelSettings,
    label_names: list[str] | None = None,
    pad_token_id: int | None = None,
    device_type: str | None = None,
    device: str | None = None,
) -> LoadedModel:
    """Load the base for the task (P1); `label_names` in the campaign's id order set the head.

    A quantized base (nf4/int8) is quantized as it loads, so it is loaded straight onto
    `device` (bitsandbytes quantizes on the GPU); any other base loads on the host and is
    moved by the caller once its method is applied.

    The frozen base loads in `model.base_dtype`, resolved here for `device_type` (None: the
    device this process trains on) and recorded in the notes and `LoadedModel.base_dtype`.
    `pad_token_id` (from `load_tokenizer`) is written to the config when it has none: sequence
    classification with decoder models finds the last real token through it.
    """
    from transformers import AutoConfig

    from tunepilot.model.base_dtype import (
        quant_compute_dtype,
        quantization_config,
        require_quantization_backend,
        resolve_base_dtype,
        torch_dtype,
    )

    base_dtype, dtype_note = resolve_base_dtype(settings.base_dtype, device_type)
    require_quantization_backend(base_dtype, device_type)
    kwargs = _build_kwargs(settings, task_kind, label_names, base_dtype)
    kwargs |= {"use_safetensors": True, "output_loading_info": True}
    compute = quant_compute_dtype(device_type)  # bf16, or fp16 on a card without bf16
    if (quantization := quantization_config(base_dtype, compute)) is not None:
        kwargs["quantization_config"] = quantization
        kwargs["dtype"] = torch_dtype(compute)
        dtype_note += f"; {base_dtype} computes in {compute}"
        if device is not None:
            kwargs["device_map"] = {"": device}
    saved_labels = None
    if task_kind != "causal_lm":
        saved_labels = _checkpoint_labels(
            AutoConfig.from_pretrained(
                str(source.path), trust_remote_code=settings.trust_remote_code
            )
        )
    try:
        with quiet_transformers():
            model, info = auto_class(task_kind).from_pretrained(str(source.path), **kwargs)
    except RuntimeError as exc:
        if "ignore_mismatched_sizes" not in str(exc) and "size mismatch" not in str(exc):
            raise
        raise InputError(
            [
                Problem(
                    "model.name_or_path",
                    f"the checkpoint's head does not fit {len(label_names or [])} labels "
                    f"(it names {saved_labels})",
                    "check data.labels against the checkpoint's labels, or start from the "
                    "encoder saved without its head",
                )
            ],
            title="base model not loadable",
        ) from exc
    except ValueError as exc:
        raise _not_loadable(source.path, task_kind, exc) from exc

    notes: list[str] = []
    params = dict(model.named_parameters())
    missing = sorted(info.get("missing_keys", ()))
    new_keys = [k for k in missing if k in params]
    if new_keys:
        notes.append(f"newly initialised, not in the checkpoint: {', '.join(new_keys[:12])}")
    if other := [k for k in missing if k not in params]:
        notes.append(f"missing non-parameter entries: {', '.join(other[:12])}")
    if saved_labels and not new_keys and saved_labels != list(label_names or []):
        notes.append(
            f"the checkpoint's trained head names its labels {saved_labels[:8]}, the campaign "
            f"{list(label_names or [])[:8]}: its rows now carry the campaign's names (check D6)"
        )
    if unexpected := sorted(info.get("unexpected_keys", ())):
        notes.append(f"{len(unexpected)} checkpoint entries unused, e.g. {unexpected[:5]}")
    return _loaded(model, source, task_kind, notes, new_keys, saved_labels, base_dtype,
                   dtype_note, pad_token_id)  # fmt: skip


def build_from_config(
    config: dict[str, Any],
    source: ModelSource,
    task_kind: ModelKind,
    settings: ModelSettings,
    label_names: list[str] | None = None,
    base_dtype: str = "fp32",
    pad_token_id: int | None = None,
    real_buffers: bool = False,
) -> LoadedModel:
    """The campaign's base built from its config.json alone, on meta tensors: no weight is
    read and no memory is used, yet every module, shape and dtype is the one `load_model`
    gives, so `apply_method` and the set-up checks run on it unchanged (the dry run, S1).

    `config` is config.json as a dict (the caller may shrink `num_hidden_layers`). A
    classification head that the checkpoint would not hold (a causal-LM or encoder
    checkpoint) is reported as new, as loading would find it. nf4/int8 build the bf16 compute
    model; sizing accounts for the quantized storage. `real_buffers` keeps the buffers the
    config computes (rotary frequencies) as real tensors and only the parameters on meta
    (accelerate's `init_empty_weights`): what FSDP from meta builds before filling its shards.
    """
    import torch

    from tunepilot.model.base_dtype import QUANTIZED

    kwargs = _build_kwargs(settings, task_kind, label_names, base_dtype)
    dtype = kwargs.pop("dtype")
    values = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = values.pop("model_type", None)
    hf_config = transformers_config(model_type, {**values, **kwargs}, str(source.path))
    try:
        if real_buffers:
            from accelerate import init_empty_weights

            empty: Any = init_empty_weights(include_buffers=False)
        else:
            empty = torch.device("meta")
        with empty, quiet_transformers():
            model = auto_class(task_kind).from_config(
                hf_config, dtype=dtype, trust_remote_code=settings.trust_remote_code
            )
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        # RuntimeError: a size transformers accepts but torch cannot make a tensor of
        raise _not_loadable(source.path, task_kind, exc) from exc
    architectures = values.get("architectures") or []
    head_saved = any(a.endswith(("ForSequenceClassification", "ForImageClassification"))
                     for a in architectures)  # fmt: skip
    prefix = f"{model.base_model_prefix}."
    new_keys = (
        [n for n, _ in model.named_parameters() if not n.startswith(prefix)]
        if task_kind != "causal_lm" and not head_saved
        else []
    )
    note = f"base built from config.json on meta tensors in {base_dtype}" + (
        " (bf16 compute; quantized storage is sized apart)" if base_dtype in QUANTIZED else ""
    )
    return _loaded(model, source, task_kind, [], new_keys, None, base_dtype, note, pad_token_id)


def transformers_config(model_type: Any, values: dict[str, Any], where: str) -> Any:
    """transformers' own config object, its validation (types, head and size relations)
    turned into bad input naming `where` instead of a traceback."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    try:
        return AutoConfig.for_model(model_type, **values)
    except (ValueError, TypeError, KeyError, StrictDataclassError) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise input_error(
            where,
            f"transformers refuses this {model_type} config: "
            f"{(lines[-1] if lines else type(exc).__name__)[:300]}",
            "correct that value as in the model's published config.json",
            title="invalid config.json",
        ) from None


def _not_loadable(path: Any, task_kind: str, exc: Exception) -> InputError:
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    return InputError(
        [
            Problem(
                "model.name_or_path",
                f"{path} cannot be loaded as a {task_kind} model ({first})",
                "use a base of an architecture that transformers supports for this task",
            )
        ],
        title="base model not loadable",
    )


def _loaded(
    model: Any,
    source: ModelSource,
    task_kind: ModelKind,
    notes: list[str],
    new_keys: list[str],
    saved_labels: list[str] | None,
    base_dtype: str,
    dtype_note: str,
    pad_token_id: int | None,
) -> LoadedModel:
    """The shared tail of loading and building: pad id, parameter count, notes."""
    if pad_token_id is not None and getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = pad_token_id
        notes.append(f"config.pad_token_id set to the tokenizer's pad id {pad_token_id}")
    total = sum(p.numel() for p in model.parameters())
    notes[:0] = [f"{type(model).__name__}: {total:,} parameters", dtype_note]
    new_modules = sorted({k.rsplit(".", 1)[0] for k in new_keys})
    return LoadedModel(model, source, task_kind, notes, new_modules, new_keys, saved_labels,
                       base_dtype)  # fmt: skip


def apply_method(
    loaded: LoadedModel, settings: ModelSettings, weights_dtype: str = "fp32"
) -> Any:
    """Full fine-tuning (every parameter trainable) or LoRA (peft), checked before and after.

    Raises SetupFailure when a target pattern matches nothing or a new head stays frozen. LoRA
    injects its layers into `loaded.model` in place, so after a SetupFailure load again.
    Over an nf4/int8 base, peft's `prepare_model_for_kbit_training` runs first, as peft
    documents for QLoRA; trained weights end in `weights_dtype` (training.weights_dtype)
    whatever `model.base_dtype` is.
    """
    from tunepilot.model.base_dtype import bridge_trained_modules, keep_trainable_in

    model = loaded.model
    if getattr(model, "is_quantized", False):
        from peft import prepare_model_for_kbit_training

        # activation checkpointing is the loop's own switch (training.activation_checkpointing)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if settings.method == "full":
        for param in model.parameters():
            param.requires_grad_(True)
    else:
        lora = settings.lora
        target_check = check_target_modules(model, lora.target_modules, lora.modules_to_save)
        if target_check.verdict is Verdict.FAIL:
            raise SetupFailure(target_check, "model.lora.target_modules")
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules="all-linear"
            if lora.target_modules == ["all-linear"]
            else list(lora.target_modules),
            modules_to_save=list(lora.modules_to_save) or None,
            # peft's SEQ_CLS wrapper forwards input_ids only: an image model gets the plain
            # wrapper, its new head saved through modules_to_save (checked just below).
            task_type=PEFT_TASK_TYPES.get(loaded.task_kind),
        )
        with warnings.catch_warnings():
            # peft still asks transformers' deprecated `is_gradient_checkpointing`
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
            model = get_peft_model(model, config)
    head_check = check_new_head_trainable(model, loaded.new_keys)
    if head_check.verdict is Verdict.FAIL:
        raise SetupFailure(head_check, "model.lora.modules_to_save")
    loaded.notes += keep_trainable_in(model, weights_dtype)
    loaded.notes += bridge_trained_modules(model)
    return model


# --------------------------------------------------------------------------------------------
# P2: what is trained, counted
# --------------------------------------------------------------------------------------------
