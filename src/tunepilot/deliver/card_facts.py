"""What the model card states, gathered once from the campaign folder at export (L5, H4, B2).

The card (card.py, card_sections.py) only formats; everything it says is collected here from
what the campaign recorded: the data (its name, files with their sha256, data version, split
counts), the training procedure (the settings the run trained with, the updates and examples
it saw, its validation points), the sealed-test look of this run if `tunepilot test --final`
was run, the framework versions of the machine that trained it (the run's env.json), and the
license and language, declared in `card:` or inherited from the base model's own card.

No machine path is collected: files are named relative to the campaign folder (or by their
name when they lie outside it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunepilot.campaign import Campaign

BASE_CARD_BYTES = 64 * 1024  # a base's README metadata block is a few hundred bytes


@dataclass
class CardFacts:
    """Everything the card states beyond the bundle spec, metrics and controls."""

    data: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    curve: list[dict[str, Any]] = field(default_factory=list)  # validation points
    test: dict[str, Any] | None = None  # this run's sealed-test look, with predictions
    test_looks: int = 0  # looks at the sealed test over the whole campaign (H4)
    comparison: dict[str, Any] | None = None  # the bundle's comparison.json
    run_env: dict[str, Any] | None = None  # runs/<id>/env.json: what trained it
    license: tuple[str | None, str] = (None, "")  # (id, where it came from)
    language: tuple[list[str], str] = ([], "")


def portable_path(path: str | Path, root: Path) -> str:
    """`path` relative to the campaign folder, or its name when it lies elsewhere."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        return p.as_posix()
    try:
        return p.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return p.name


def data_facts(ws: Any, campaign: Campaign, data_version: str) -> dict[str, Any]:
    """The training data as a card names it: a name, the files with sha256, the version."""
    from tunepilot.campaign.checks import data_paths
    from tunepilot.model.base import sha256_file

    splits = _read_json(ws.root / "data" / data_version / "splits.json") or {}
    files = []
    for key, path in data_paths(campaign, ws.root).items():
        entry: dict[str, Any] = {"split": key, "path": portable_path(path, ws.root)}
        if path.is_file():
            entry |= {"sha256": sha256_file(path), "bytes": path.stat().st_size}
        files.append(entry)
    return {"name": campaign.card.dataset_name or dataset_name(campaign, ws.root),
            "hub_ids": list(campaign.card.datasets), "files": files, "version": data_version,
            "counts": splits.get("counts") or {}, "policy": splits.get("policy") or {},
            "cleaning": len(campaign.data.cleaning)}  # fmt: skip


def dataset_name(campaign: Campaign, root: Path) -> str:
    """The data's folder name (`banking77/train.jsonl` -> banking77), or the file's stem when
    it sits in the campaign folder itself; never a split name such as "train"."""
    d = campaign.data
    paths = [Path(p) for p in ([d.file] if d.file else list((d.files or {}).values())) if p]
    if not paths:
        return campaign.name
    parents = {(root / p).resolve().parent if not p.is_absolute() else p.parent for p in paths}
    parent = parents.pop() if len(parents) == 1 else None
    if parent is not None and parent != root.resolve() and parent.name:
        return parent.name
    return paths[0].stem if len(paths) == 1 else campaign.name


def training_facts(campaign: Campaign, run: Any, n_train: int) -> dict[str, Any]:
    """The settings the run trained with, under the Hugging Face card template's names where
    it has one (learning_rate, train_batch_size ...), and what the run saw."""
    from tunepilot.train.arithmetic import plan_updates

    t, m = campaign.training, campaign.model
    world = int((run.budget or {}).get("world_size") or 1)
    plan = plan_updates(n_train, t.microbatch, t.accumulation, world, updates=t.budget.updates,
                        epochs=t.budget.epochs, drop_last=t.drop_last)  # fmt: skip
    out: dict[str, Any] = {
        "learning_rate": t.lr, "lr_scheduler_type": t.scheduler,
        "lr_scheduler_warmup_steps": t.warmup_updates,
        "optimizer": f"AdamW (torch), weight_decay={t.weight_decay}",
        "train_batch_size": t.microbatch, "gradient_accumulation_steps": t.accumulation,
        "num_devices": world, "distributed_type": t.distributed.strategy if world > 1 else "none",
        "total_train_batch_size": plan.examples_per_update, "training_steps": plan.total_updates,
        "epochs": round(plan.epochs, 4), "examples_seen": plan.examples_seen,
        "eval_batch_size": t.eval_batch_size, "seed": run.seed,
        "mixed_precision_training": t.precision if t.precision != "fp32" else "none (fp32)",
        "max_grad_norm": t.max_grad_norm, "max_length": campaign.data.max_length,
        "activation_checkpointing": t.activation_checkpointing,
        "base_dtype": m.base_dtype or "default (fp32 on CPU, bf16 on a CUDA GPU with bf16)",
        "method": m.method, "loss_normalisation": "sum over the update's target tokens / their "
        "count in the whole update (S2)",
    }  # fmt: skip
    if m.method == "lora":
        out |= {"lora_r": m.lora.r, "lora_alpha": m.lora.alpha, "lora_dropout": m.lora.dropout,
                "lora_target_modules": list(m.lora.target_modules),
                "modules_to_save": list(m.lora.modules_to_save)}  # fmt: skip
    return out


def validation_curve(evaluations: list[Any], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """The run's validation points: update and its headline metrics and loss."""
    return [{"update": e.update, **{k: e.metrics.get(k) for k in (*keys, "loss")
                                    if isinstance(e.metrics.get(k), int | float)}}
            for e in evaluations if e.split == "validation"]  # fmt: skip


def sealed_test(ledger: Any, run_id: str) -> tuple[dict[str, Any] | None, int]:
    """This run's latest look at the sealed test split (H4) with its predictions, and how many
    looks the campaign has taken in all."""
    looks = ledger.test_looks()
    tests = [e for e in ledger.evaluations(run_id=run_id, split="test")]
    if not tests:
        return None, len(looks)
    e = tests[-1]
    return ({"look": e.test_look, "metrics": e.metrics, "data_version": e.data_version,
             "predictions": ledger.predictions(e.id)}, len(looks))  # fmt: skip


def base_card_metadata(folder: Path) -> dict[str, Any]:
    """The `---` metadata block of the base model's README.md (its Hub card), or {}.

    Read here with a bound rather than by huggingface_hub's loader: the base folder may come
    from anywhere, and a YAML block with anchors and aliases can expand without limit; one
    that has any is not read (the card then says the license is undeclared).
    """
    import yaml

    path = Path(folder) / "README.md"
    try:
        with path.open("rb") as handle:
            head = handle.read(BASE_CARD_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return {}
    if not head.startswith("---"):
        return {}
    end = head.find("\n---", 3)
    if end < 0:
        return {}
    block = head[3:end]
    try:
        if any(isinstance(ev, yaml.AliasEvent) for ev in yaml.parse(block, Loader=yaml.SafeLoader)):
            return {}
        meta = yaml.safe_load(block)
    except yaml.YAMLError:
        return {}
    return meta if isinstance(meta, dict) else {}


def license_and_language(campaign: Campaign, base_folder: Path) -> tuple[Any, Any]:
    """(license, source), (languages, source): declared in `card:` first, else the base's."""
    base = base_card_metadata(base_folder)
    declared = campaign.card
    lic = base.get("license") if isinstance(base.get("license"), str) else None
    langs = base.get("language")
    langs = [langs] if isinstance(langs, str) else [x for x in langs or [] if isinstance(x, str)]
    license_ = ((declared.license, "declared in the campaign (card.license)") if declared.license
                else (lic, "the base model's card") if lic else (None, ""))  # fmt: skip
    language = ((list(declared.language), "declared in the campaign (card.language)")
                if declared.language else (langs, "the base model's card") if langs
                else ([], ""))  # fmt: skip
    return license_, language


def read_run_env(run_dir: Path) -> dict[str, Any] | None:
    return _read_json(Path(run_dir) / "env.json")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
