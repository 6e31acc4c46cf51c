"""Variants (V1): each one changes one explainable set of settings against its control.

A variant is the control campaign with dotted overrides applied. Overrides are grouped by what
they mean (learning rate, batch shape, LoRA shape, precision ...); a variant that touches more
than one group is refused unless it says `allow_multi_change: true` and why, because a
comparison that changes two things at once cannot say which one helped.
"""

from __future__ import annotations

from typing import Any

from tunepilot.campaign.loading import apply_overrides, validate_mapping
from tunepilot.campaign.schema import Campaign
from tunepilot.errors import InputError, Problem, input_error

CONTROL = "control"

# Keys that belong together: changing several keys of one group is still one explainable change.
SETTING_GROUPS: dict[str, str] = {
    "training.lr": "learning rate",
    "training.scheduler": "learning-rate schedule",
    "training.warmup_updates": "learning-rate schedule",
    "training.microbatch": "batch shape",
    "training.accumulation": "batch shape",
    "training.distributed": "batch shape",
    "training.budget": "budget",
    "training.precision": "precision",
    "training.activation_checkpointing": "activation checkpointing",
    "training.weight_decay": "regularisation",
    "training.max_grad_norm": "regularisation",
    "model.lora": "LoRA shape",
    "model.method": "adaptation method",
    "data.max_length": "sequence length",
    "data.template": "prompt template",
}
# Settings that must be the same for every variant: they define the comparison itself (V2).
FIXED_FOR_ALL = ("training.seed", "training.eval_every", "training.stop", "data.split", "seeds")


def setting_group(key: str) -> str:
    """The group a dotted key belongs to: the longest matching prefix, else the key itself."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        group = SETTING_GROUPS.get(".".join(parts[:n]))
        if group:
            return group
    return key


def variant_names(campaign: Campaign) -> list[str]:
    """The control first, then the variants in file order."""
    return [CONTROL, *campaign.variants]


def variant_campaign(campaign: Campaign, name: str) -> Campaign:
    """The campaign a variant trains: the control with the variant's overrides applied."""
    if name == CONTROL:
        return campaign
    if name not in campaign.variants:
        raise InputError(
            [Problem("--variant", f"unknown variant `{name}`",
                     f"use one of {', '.join(variant_names(campaign))}")],
            title="invalid variant",
        )
    raw = campaign.model_dump(mode="json")
    raw = apply_overrides(raw, campaign.variants[name].overrides)
    raw["variants"] = {}
    return validate_mapping(raw, source=f"variants.{name}.overrides")


def check_variants(campaign: Campaign) -> list[Problem]:
    """Every variant must validate, change something, and change one group only (V1, V2)."""
    problems: list[Problem] = []
    for name, variant in campaign.variants.items():
        where = f"variants.{name}.overrides"
        if not variant.overrides:
            problems.append(Problem(where, "the variant changes nothing",
                                    "add the dotted settings it changes, e.g. training.lr: 5e-5"))
            continue
        fixed = [k for k in variant.overrides if k.startswith(FIXED_FOR_ALL)]
        for key in fixed:
            problems.append(Problem(
                f"{where}.{key}", "this setting defines the comparison and must be the same for "
                "every variant (V2)", "move it to the campaign itself, or start a new campaign"))
        groups = sorted({setting_group(k) for k in variant.overrides})
        if len(groups) > 1 and not variant.allow_multi_change:
            problems.append(Problem(
                where, f"changes {len(groups)} groups of settings at once ({', '.join(groups)})",
                "split it into one variant per group, or set allow_multi_change: true with a "
                "reason (V1)"))
        try:
            variant_campaign(campaign, name)
        except InputError as err:
            problems += [Problem(f"{where}: {p.where}", p.found, p.fix) for p in err.problems]
    return problems


def variant_diff(campaign: Campaign, name: str) -> dict[str, Any]:
    """What a variant changes relative to its control, as {key: [control value, variant value]}."""
    if name == CONTROL:
        return {}
    control = campaign.model_dump(mode="json")
    diff: dict[str, Any] = {}
    for key, value in campaign.variants[name].overrides.items():
        node: Any = control
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        diff[key] = [node, value]
    return diff


def parse_seeds(text: str | None, default: list[int]) -> list[int]:
    """`--seeds 0,1,2` from the command line, or the campaign's own seeds when not given."""
    if not text:
        return list(default)
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise input_error("--seeds", f"`{text}` is not a comma-separated list of integers",
                          "write e.g. --seeds 0,1,2") from None
