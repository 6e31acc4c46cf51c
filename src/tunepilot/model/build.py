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

import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

from tunepilot.campaign import ModelSettings
from tunepilot.errors import InputError, Problem
from tunepilot.model.base import ModelSource, quiet_transformers
from tunepilot.verdict import Finding, Verdict

ModelKind = Literal["classification", "causal_lm", "image_classification"]
_LINEAR_TYPES = ("Linear", "Conv1D")  # nn.Linear and GPT-2 style transformers Conv1D
_PEFT_PREFIX = "base_model.model."


AUTO_CLASSES: dict[str, str] = {
    "classification": "AutoModelForSequenceClassification",
    "causal_lm": "AutoModelForCausalLM",
    "image_classification": "AutoModelForImageClassification",
}
"""The transformers Auto class per model kind; export writes the same name into bundle.json."""
PEFT_TASK_TYPES = {"classification": "SEQ_CLS", "causal_lm": "CAUSAL_LM"}


class SetupFailure(InputError):
    """A model set-up that would train silently wrong; carries the FAIL finding and its fix.

    It is bad input (the campaign's `key` asks for it), so every command reports it like any
    other: the key, what was seen and the fix, exit 2. The pilot turns it into a FAIL gate.
    """

    def __init__(self, finding: Finding, key: str = "model") -> None:
        self.finding = finding
        super().__init__(
            [Problem(key, finding.sentence, "change that setting as the sentence says")],
            title="model set-up refused",
        )


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


def _checkpoint_labels(config: Any) -> list[str] | None:
    """The label names a checkpoint's config carries, None when they are transformers' defaults."""
    id2label = getattr(config, "id2label", None) or {}
    names = [str(id2label[k]) for k in sorted(id2label, key=int)]
    if not names or all(n == f"LABEL_{i}" for i, n in enumerate(names)):
        return None
    return names


def load_model(
    source: ModelSource,
    task_kind: ModelKind,
    settings: ModelSettings,
    label_names: list[str] | None = None,
    dtype: Any = None,
    pad_token_id: int | None = None,
) -> LoadedModel:
    """Load the base for the task (P1); `label_names` in the campaign's id order set the head.

    `pad_token_id` (from `load_tokenizer`) is written to the config when it has none: sequence
    classification with decoder models finds the last real token through it.
    """
    import torch
    import transformers
    from transformers import AutoConfig

    kwargs: dict[str, Any] = {
        "dtype": dtype or torch.float32,
        "trust_remote_code": settings.trust_remote_code,
        "use_safetensors": True,
        "output_loading_info": True,
    }
    if settings.attn_implementation:
        kwargs["attn_implementation"] = settings.attn_implementation
    notes: list[str] = []
    saved_labels = None
    if task_kind != "causal_lm":
        if not label_names:
            raise ValueError("classification needs label_names in the campaign's id order")
        saved_labels = _checkpoint_labels(
            AutoConfig.from_pretrained(
                str(source.path), trust_remote_code=settings.trust_remote_code
            )
        )
        kwargs |= {
            "num_labels": len(label_names),
            "id2label": dict(enumerate(label_names)),
            "label2id": {name: i for i, name in enumerate(label_names)},
        }
    auto = getattr(transformers, AUTO_CLASSES[task_kind])
    try:
        with quiet_transformers():
            model, info = auto.from_pretrained(str(source.path), **kwargs)
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
        first = str(exc).strip().splitlines()[0][:300]
        raise InputError(
            [
                Problem(
                    "model.name_or_path",
                    f"{source.path} cannot be loaded as a {task_kind} model ({first})",
                    "use a base of an architecture that transformers supports for this task",
                )
            ],
            title="base model not loadable",
        ) from exc

    params = dict(model.named_parameters())
    missing = sorted(info.get("missing_keys", ()))
    new_keys = [k for k in missing if k in params]
    new_modules = sorted({k.rsplit(".", 1)[0] for k in new_keys})
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
    if pad_token_id is not None and getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = pad_token_id
        notes.append(f"config.pad_token_id set to the tokenizer's pad id {pad_token_id}")
    total = sum(p.numel() for p in model.parameters())
    notes.insert(0, f"{type(model).__name__}: {total:,} parameters ({kwargs['dtype']})")
    return LoadedModel(model, source, task_kind, notes, new_modules, new_keys, saved_labels)


def linear_module_names(model: Any) -> list[str]:
    """Deduplicated short names of the modules LoRA can target (query, key, value, dense ...)."""
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if name and type(module).__name__ in _LINEAR_TYPES
    }
    return sorted(names)


def _matches(pattern: str, name: str) -> bool:
    """peft's rule for a list of target names: the full name, or a dotted suffix of it."""
    return name == pattern or name.endswith(f".{pattern}")


def check_target_modules(
    model: Any, patterns: list[str], modules_to_save: list[str] | tuple[str, ...] = ()
) -> Finding:
    """P1/P2: every `target_modules` pattern must match at least one module of the base.

    peft raises only when *no* pattern matches; `["query", "q_proj"]` on BERT silently adapts
    query alone. Modules listed in modules_to_save are not targets (peft excludes them too).
    """
    if list(patterns) == ["all-linear"]:
        return Finding("lora-targets", Verdict.PASS, "target_modules is all-linear", "P1, P2")
    names = [n for n, _ in model.named_modules() if n]
    saved = [
        n
        for n in names
        if any(re.match(rf"(^|.*\.){re.escape(m)}($|\..*)", n) for m in modules_to_save)
    ]
    counts = {p: sum(_matches(p, n) for n in names if n not in saved) for p in patterns}
    unmatched = [p for p, c in counts.items() if c == 0]
    if unmatched:
        existing = linear_module_names(model)
        return Finding(
            "lora-targets",
            Verdict.FAIL,
            f"model.lora.target_modules {unmatched} match no module of this model; its linear "
            f"modules are {existing}; fix model.lora.target_modules",
            "P1, P2",
            examples=existing[:20],
            details={"unmatched": unmatched, "matches": counts, "linear_modules": existing},
        )
    return Finding(
        "lora-targets",
        Verdict.PASS,
        f"target_modules match {sum(counts.values())} modules ({counts})",
        "P1, P2",
        details={"matches": counts},
    )


def _original_name(name: str) -> str | None:
    """Map a (possibly peft-wrapped) parameter name to the base model's key, None for copies.

    `base_model.model.classifier.modules_to_save.default.weight` -> `classifier.weight` (the
    trained copy); `...original_module...` is peft's frozen original and maps to None.
    """
    name = name.removeprefix(_PEFT_PREFIX)
    if ".original_module." in name:
        return None
    name = re.sub(r"\.modules_to_save\.[^.]+\.", ".", name)
    return name.replace(".base_layer.", ".")


def _save_name(module: str, names: list[str]) -> str:
    """The shortest dotted suffix naming only `module`: peft matches modules_to_save with
    `name.endswith(entry)`, so `dense` would also save every attention output projection."""
    parts = module.split(".")
    for i in range(len(parts) - 1, -1, -1):
        suffix = ".".join(parts[i:])
        if all(n == module or not n.endswith(suffix) for n in names):
            return suffix
    return module


def check_new_head_trainable(model: Any, new_keys: list[str]) -> Finding:
    """P2: every newly initialised weight must be trained, judged on the wrapped model itself.

    peft adds `classifier`/`score` to modules_to_save for SEQ_CLS on its own, but not other new
    layers (DistilBERT's `pre_classifier`, a BERT pooler missing from the checkpoint). A frozen
    random layer still lets the loss fall a little through the adapters: a silent failure.
    """
    trainable = {_original_name(n) for n, p in model.named_parameters() if p.requires_grad} - {None}
    frozen = [k for k in new_keys if k not in trainable]
    if frozen:
        modules = sorted({k.rsplit(".", 1)[0] for k in frozen})
        names = [n.removeprefix(_PEFT_PREFIX) for n, _ in model.named_modules()]
        short = sorted({_save_name(m, names) for m in modules})
        return Finding(
            "new-head-trainable",
            Verdict.FAIL,
            f"newly initialised weights {frozen[:6]} are frozen: they would stay random; add "
            + ", ".join(f"`{s}`" for s in short)
            + " to model.lora.modules_to_save",
            "P2",
            examples=frozen[:20],
            details={"frozen_new_keys": frozen, "modules": modules},
        )
    return Finding(
        "new-head-trainable",
        Verdict.PASS,
        f"all {len(new_keys)} newly initialised weights are trainable",
        "P2",
        details={"new_keys": new_keys},
    )


def apply_method(loaded: LoadedModel, settings: ModelSettings) -> Any:
    """Full fine-tuning (every parameter trainable) or LoRA (peft), checked before and after.

    Raises SetupFailure when a target pattern matches nothing or a new head stays frozen. LoRA
    injects its layers into `loaded.model` in place, so after a SetupFailure load again.
    """
    model = loaded.model
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
    return model


def enable_activation_checkpointing(model: Any) -> list[str]:
    """Recompute activations in backward (S3), non-reentrant; returns notes.

    Non-reentrant checkpointing propagates gradients even when the checkpointed block's inputs
    do not require grad (frozen embeddings under LoRA); input grads are still enabled under
    peft because some remote-code models use reentrant checkpointing regardless.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise SetupFailure(
            Finding(
                "activation-checkpointing",
                Verdict.FAIL,
                f"{type(base).__name__} does not support activation checkpointing; set "
                "training.activation_checkpointing=false",
                "S3",
            ),
            "training.activation_checkpointing",
        )
    kwargs = {"use_reentrant": False}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    notes = [f"activation checkpointing on ({type(base).__name__}, non-reentrant)"]
    if base is not model and hasattr(base, "enable_input_require_grads"):
        base.enable_input_require_grads()
        notes.append("input embeddings emit grads (frozen embeddings under LoRA)")
    if getattr(base.config, "use_cache", False):
        base.config.use_cache = False  # a KV cache is useless in training and breaks recompute
        notes.append("config.use_cache set to False")
    return notes


# --------------------------------------------------------------------------------------------
# P2: what is trained, counted
# --------------------------------------------------------------------------------------------
