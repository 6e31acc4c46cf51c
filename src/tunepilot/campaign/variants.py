"""Variants (V1): each one changes one explainable set of settings against its control.

A variant is the control campaign with dotted overrides applied. Overrides are grouped by what
they mean (learning rate, batch shape, LoRA shape, precision ...); a variant that touches more
than one group is refused unless it says `allow_multi_change: true` and why, because a
comparison that changes two things at once cannot say which one helped.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from tunepilot.campaign.bounds import SEEDS
from tunepilot.campaign.loading import apply_overrides, leaf_settings, validate_mapping
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
    "training.weights_dtype": "precision",
    "training.tf32": "precision",
    "training.optimizer": "optimizer",
    "training.optimizer_in_backward": "optimizer",
    "training.activation_checkpointing": "activation checkpointing",
    "training.weight_decay": "regularisation",
    "training.max_grad_norm": "regularisation",
    "model.lora": "LoRA shape",
    "model.method": "adaptation method",
    "data.max_length": "sequence length",
    "data.template": "prompt template",
}
# Settings that must be the same for every variant: they define the comparison itself and the
# evaluation procedure (V2): what is evaluated, how, when, and judged against which guards.
FIXED_FOR_ALL = (
    "name", "hypothesis", "seeds", "data.file", "data.files", "data.fields", "data.labels",
    "data.split", "training.seed", "training.eval_every", "training.eval_batch_size",
    "training.max_new_tokens", "training.stop",
)  # fmt: skip


def variant_settings(campaign: Campaign, name: str) -> dict[str, Any]:
    """A variant's overrides as {dotted leaf key: value}, however its YAML nests them (V1)."""
    if name == CONTROL:
        return {}
    leaves = leaf_settings(campaign.variants[name].overrides)
    return {".".join(path): value for path, value in leaves.items()}


def _fixed(key: str) -> bool:
    return any(key == f or key.startswith(f + ".") for f in FIXED_FOR_ALL)


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
    raw = apply_overrides(raw, campaign.variants[name].overrides, source=f"variants.{name}")
    raw["variants"] = {}
    return validate_mapping(raw, source=f"variants.{name}.overrides")


def check_variants(campaign: Campaign) -> list[Problem]:
    """Every variant must validate, change something, and change one group only (V1, V2).

    Judged on leaf settings whose value really differs from the control's, however the YAML
    nests them: `training: {lr: 2e-4, microbatch: 4}` is two changes, not one."""
    problems: list[Problem] = []
    for name, variant in campaign.variants.items():
        where = f"variants.{name}.overrides"
        for key in filter(_fixed, variant_settings(campaign, name)):
            problems.append(Problem(
                f"{where}.{key}", "this setting defines the comparison and must be the same for "
                "every variant (V2)", "move it to the campaign itself, or start a new campaign"))
        if not variant_settings(campaign, name):
            problems.append(Problem(where, "the variant changes nothing",
                                    "add the dotted settings it changes, e.g. training.lr: 5e-5"))
            continue
        try:  # a setting equal to the control's is no change; it never makes a second group
            changed = variant_diff(campaign, name)
        except InputError as err:
            problems += [Problem(f"{where}: {p.where}", p.found, p.fix) for p in err.problems]
            continue
        groups = sorted({setting_group(k) for k in changed})
        if len(groups) > 1 and not variant.allow_multi_change:
            problems.append(Problem(
                where, f"changes {len(groups)} groups of settings at once ({', '.join(groups)})",
                "split it into one variant per group, or set allow_multi_change: true with a "
                "reason (V1)"))
    return problems


def variant_diff(campaign: Campaign, name: str) -> dict[str, Any]:
    """What a variant changes relative to its control, as {leaf key: [control value, variant
    value]}: only settings whose validated value differs. Raises InputError for a variant that
    does not validate."""
    if name == CONTROL:
        return {}
    control = campaign.model_dump(mode="json")
    variant = variant_campaign(campaign, name).model_dump(mode="json")
    diff: dict[str, Any] = {}
    for key in variant_settings(campaign, name):
        before, after = _at(control, key), _at(variant, key)
        if before != after:
            diff[key] = [before, after]
    return diff


def _at(mapping: dict[str, Any], key: str) -> Any:
    node: Any = mapping
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def parse_seeds(text: str | None, default: list[int]) -> list[int]:
    """`--seeds 0,1,2` from the command line, or the campaign's own seeds when not given.

    Held to the campaign file's own rule for `seeds` (the schema's bounds, each seed once), so
    the command line cannot run what the file would refuse."""
    if text is None:
        return list(default)
    fix = "write e.g. --seeds 0,1,2, or leave --seeds out to run the campaign's seeds"
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise input_error("--seeds", f"`{text}` is not a comma-separated list of integers",
                          fix) from None
    try:
        SEEDS.validate_python(seeds)
    except ValidationError as exc:
        found = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise input_error("--seeds", f"`{text}`: {found}", fix) from None
    return seeds
