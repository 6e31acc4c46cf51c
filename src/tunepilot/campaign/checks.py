"""Checks a campaign needs beyond its schema, still without importing torch: files exist,
variants are single explainable changes (V1, V2). Run by `tunepilot validate`."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from tunepilot.campaign.schema import Campaign
from tunepilot.campaign.variants import check_variants, variant_campaign, variant_names
from tunepilot.errors import InputError, Problem

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def hub_id_form(text: str) -> bool:
    """`name` or `org/name` as the Hub spells repository ids, and nothing that reads as a path
    (`./x`, `/x`, `~/x`, `a/b/c`, `C:\\x`): what `model.name_or_path` means when no such
    folder exists."""
    path_like = (text.startswith(("/", "./", "../", "~", "\\")) or text.count("/") > 1
                 or "\\" in text or bool(re.match(r"^[A-Za-z]:", text)))  # fmt: skip
    return not path_like and bool(_HUB_ID.match(text))


def data_paths(campaign: Campaign, root: Path) -> dict[str, Path]:
    """The data files, resolved next to the campaign file when relative."""
    d = campaign.data
    named = dict(d.files) if d.files else {"file": d.file}
    return {k: (root / v if not Path(v).is_absolute() else Path(v)) for k, v in named.items() if v}


def saved_dataset_folder(path: Path) -> tuple[Path, str | None] | None:
    """(folder, split) when `path` names a folder written by `datasets`' `save_to_disk`,
    optionally with a `[split]` suffix; None for anything else."""
    match = re.fullmatch(r"(.+)\[([\w.-]+)\]", str(path))
    folder, split = (Path(match[1]), match[2]) if match else (Path(path), None)
    markers = ("dataset_dict.json", "state.json")
    if folder.is_dir() and any((folder / name).is_file() for name in markers):
        return folder, split
    return None


def check_campaign(campaign: Campaign, root: Path) -> list[Problem]:
    problems: list[Problem] = []
    folders_ok = campaign.hypothesis.task == "image_classification"  # a folder per class
    for key, path in data_paths(campaign, root).items():
        readable = path.is_file() or saved_dataset_folder(path) is not None
        if not (readable or (folders_ok and path.is_dir())):
            dotted = "data.file" if key == "file" else f"data.files.{key}"
            problems.append(Problem(dotted, f"no such file {path}",
                                    "fix the path (relative paths start at the campaign folder)"))
    model = campaign.model
    local = root / model.name_or_path
    looks_local = model.name_or_path.startswith((".", "/", "~")) or local.exists()
    if looks_local and not (local / "config.json").is_file() and model.name_or_path != "minilm":
        problems.append(Problem("model.name_or_path", f"{local} has no config.json",
                                "point it at a Hugging Face model folder"))
    if (not looks_local and hub_id_form(model.name_or_path) and "/" in model.name_or_path
            and not model.revision):
        problems.append(Problem("model.revision", f"hub id `{model.name_or_path}` without a "
                                "revision", "pin the exact commit so every run sees the same "
                                "weights (P4)"))
    if looks_local and (local / "config.json").is_file():
        problems += _beyond_positions(campaign, local / "config.json")
    spec = campaign.data.dataset
    if spec is not None and not spec.revision and hub_id_form(spec.name) and not (
            root / spec.name).expanduser().is_dir():  # fmt: skip
        problems.append(Problem("data.dataset.revision", f"Hub dataset `{spec.name}` without "
                                "a revision", "pin the dataset repository's commit so every "
                                "run sees the same rows (D1)"))  # fmt: skip
    problems += _repeated_split_files(campaign, root)
    problems += check_variants(campaign)
    return problems


POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx")


def position_limit(model_config: dict[str, Any]) -> tuple[str, int] | None:
    """(config key, positions) of a model's config.json: the longest input it can take."""
    for key in POSITION_KEYS:
        value = model_config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return key, value
    return None


def _beyond_positions(campaign: Campaign, config_file: Path) -> list[Problem]:
    """S6: a max_length (the campaign's or a variant's) beyond the model's position table
    crashes the run with a size mismatch; rotary models with rope_scaling are left to the
    audit, which warns."""
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []  # loading the model reports an unreadable config with its own words
    lengths = {"data.max_length": campaign.data.max_length}
    for name in variant_names(campaign)[1:]:  # a variant's own max_length, once
        try:
            length = variant_campaign(campaign, name).data.max_length
        except InputError:
            continue  # check_variants names a broken variant
        if length != campaign.data.max_length:
            lengths[f"variants.{name}.overrides data.max_length"] = length
    return beyond_positions(lengths, config, config_file)


def beyond_positions(lengths: dict[str, int], config: Any, config_file: Path) -> list[Problem]:
    """S6: each max_length (by the key that sets it) beyond the model's position table. One
    judgement for `validate` and for every command that encodes (run, baseline, resume ...):
    whichever split holds the long text, an input that long would crash with a size mismatch,
    so it is refused before the data is encoded and before a run id is reserved."""
    found = position_limit(config) if isinstance(config, dict) else None
    if found is None or config.get("rope_scaling"):
        return []
    key, limit = found
    return [Problem(where, f"{value} is beyond the model's {key} {limit} ({config_file}): an "
                    "input that long crashes the run with a size mismatch",
                    f"set it to at most {limit}")
            for where, value in lengths.items() if value > limit]  # fmt: skip


def campaign_warnings(campaign: Campaign) -> list[Problem]:
    """Settings that are valid but that a reader of the results must see: validate prints them
    and the dossier lists them among the observed limits."""
    warnings: list[Problem] = []
    if campaign.model.trust_remote_code:
        warnings.append(Problem(
            "model.trust_remote_code", "true: Python files shipped with the model "
            f"`{campaign.model.name_or_path}` run on this machine when it loads",
            "read the model's .py files at the pinned revision first, or set it to false"))
    return warnings + guard_warnings(campaign)


def guard_warnings(campaign: Campaign) -> list[Problem]:
    """H2: every guard the campaign declares can be judged on its task's evaluation; one that
    cannot (a JSON rate for a classifier, a per-class floor for extraction, a schema rate
    without a schema, JSON rates for chat answers of free text) would never block anything."""
    h, where = campaign.hypothesis, "hypothesis"
    declared = h.model_fields_set
    out: list[Problem] = []
    if h.is_classification:
        if "extraction_guards" in declared:
            out.append(Problem(f"{where}.extraction_guards", "declared for a classification "
                               "campaign, whose evaluation has no JSON rates: never judged",
                               "remove them; a classifier is guarded per class "
                               "(classification_guards)"))  # fmt: skip
        labels = campaign.data.labels
        unknown = sorted(set(h.classification_guards.class_floors) - set(labels or []))
        if labels and unknown:
            out.append(Problem(f"{where}.classification_guards.class_floors",
                               f"names {', '.join(unknown)}, absent from data.labels: never "
                               "judged", "use the class names of data.labels"))  # fmt: skip
        return out
    if "classification_guards" in declared:
        out.append(Problem(f"{where}.classification_guards", f"declared for a {h.task} "
                           "campaign, whose evaluation has no classes: never judged",
                           "remove them; guard the answers with extraction_guards"))  # fmt: skip
    guards = h.extraction_guards.model_fields_set if "extraction_guards" in declared else set()
    free_text = (campaign.data.chat is not None and h.task == "format"
                 and not (h.required_fields or h.target_schema))  # fmt: skip
    if free_text and guards:
        out.append(Problem(f"{where}.extraction_guards", f"{', '.join(sorted(guards))} declared, "
                           "but the answers are assistant turns of free text: the JSON rates "
                           "are not computed, so these never block", "declare "
                           "hypothesis.required_fields or target_schema if the answers are "
                           "JSON, or remove the guards"))  # fmt: skip
        return out
    if "schema_validity_min" in guards and h.target_schema is None:
        out.append(Problem(f"{where}.extraction_guards.schema_validity_min", "declared without "
                           "hypothesis.target_schema: it can only repeat json_validity",
                           "declare the answer's JSON Schema in hypothesis.target_schema"))
    if "required_field_presence_min" in guards and not h.required_fields:
        out.append(Problem(f"{where}.extraction_guards.required_field_presence_min", "declared "
                           "without hypothesis.required_fields: every answer that parses "
                           "passes it", "list the fields in hypothesis.required_fields"))
    return out


def _repeated_split_files(campaign: Campaign, root: Path) -> list[Problem]:
    """D8: a test (or validation) file that is the train file, by path or by content, scores
    the model on what it trained on; dedup would then empty it without saying why."""
    if not campaign.data.files:
        return []
    seen: list[tuple[str, Path, str]] = []
    problems: list[Problem] = []
    for key, path in data_paths(campaign, root).items():
        if not path.is_file():
            continue
        with path.open("rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        for other, other_path, other_digest in seen:
            if path.resolve() == other_path.resolve():
                why = f"the same file as data.files.{other} ({path})"
            elif digest == other_digest:
                why = (f"identical in content to data.files.{other} ({other_path.name}, sha256 "
                       f"{digest[:12]}...)")  # fmt: skip
            else:
                continue
            problems.append(Problem(f"data.files.{key}", why,
                                    f"give a {key} file with other examples than "
                                    f"data.files.{other}, or leave data.files.{key} out and "
                                    "it is carved from train by data.split"))  # fmt: skip
            break
        seen.append((key, path, digest))
    return problems


def raise_on_problems(campaign: Campaign, root: Path, source: str) -> None:
    problems = check_campaign(campaign, root)
    if problems:
        raise InputError(problems, title=f"invalid campaign {source}")
