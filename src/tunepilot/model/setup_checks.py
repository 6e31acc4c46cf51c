"""The set-up checks a model passes before it trains (P1, P2): targets that match, a new head
that trains. Kept apart from loading so a model built on meta tensors (the dry run) passes the
very same checks a loaded one does.
"""

from __future__ import annotations

import re
from typing import Any

from tunepilot.verdict import Finding, Verdict

_LINEAR_TYPES = ("Linear", "Conv1D")  # nn.Linear and GPT-2 style transformers Conv1D
_PEFT_PREFIX = "base_model.model."


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
    unmatched = [p for p, c in counts.items() if c == 0] or ([] if counts else ["(none)"])
    if unmatched:
        existing = linear_module_names(model)
        return Finding(
            "lora-targets",
            Verdict.FAIL,
            f"model.lora.target_modules {unmatched} match no module of this model; its linear "
            f"modules are {existing}; fix model.lora.target_modules",
            "P1, P2",
            examples=existing[:20],
            details={"unmatched": unmatched, "matches": counts, "linear_modules": existing,
                     "fix": f"set model.lora.target_modules to names from {existing[:8]} (or "
                     "[all-linear])"},  # fmt: skip
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
            details={"frozen_new_keys": frozen, "modules": modules,
                     "fix": "add " + ", ".join(short) + " to model.lora.modules_to_save"},
        )
    return Finding(
        "new-head-trainable",
        Verdict.PASS,
        f"all {len(new_keys)} newly initialised weights are trainable",
        "P2",
        details={"new_keys": new_keys},
    )
