"""The delivered bundle (P4, R3, L5): a folder a colleague can use without tunepilot.

```
exports/<run-id>/
  adapter_model.safetensors + adapter_config.json   LoRA in PEFT's own format, tied to its base
  (or model.safetensors + config.json)              a full fine-tune
  tokenizer files                                   as the run used them (pad token included)
  campaign.resolved.yaml  base.json  env.json       what was trained, on which base, where
  bundle.json  metrics.json  run.json ...           how to load it, data version, raw metrics
  comparison.json                                   the decision, this run vs control and baseline
  control.json                                      inputs and the outputs the model gave them
  README.md                                         the 3-line load snippet, task and labels
  MANIFEST.json                                     sha256 and size of every other file
```

Why each piece: an adapter alone is useless without the exact base it was trained on, so
`adapter_config.json` names it and its resolved commit and `base.json` holds the sha256 of
its weight files (P4). The control outputs are computed from the model in memory *before*
saving, so `tunepilot verify` (a new process, plain transformers + peft) can prove the saved
files reproduce it (R2). The folder is written under a temporary name and renamed into place:
an export is whole or absent, and an existing export is never overwritten.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from tunepilot.campaign import Campaign
from tunepilot.data.workspace import Workspace
from tunepilot.deliver.bundle_check import FORMAT, IMAGES_FILE, MANIFEST, unsafe_reason
from tunepilot.deliver.card import model_card, read_audit
from tunepilot.deliver.provenance import bundle_extras
from tunepilot.errors import input_error, writing
from tunepilot.model.build import AUTO_CLASSES
from tunepilot.model.processors import quiet_transformers
from tunepilot.tasks.example import Example
from tunepilot.train.manifest import write_manifest
from tunepilot.verdict import Verdict


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _load_spec(model: Any, kind: str, label_names: list[str] | None) -> dict[str, Any]:
    """How to rebuild the model: the Auto class, dtype and config values set at training."""
    base = model.get_base_model() if _is_peft(model) else model
    images = kind == "image_classification"  # a vision config takes no pad_token_id
    config: dict[str, Any] = {} if images else {"pad_token_id": base.config.pad_token_id}
    if kind != "causal_lm":
        names = list(label_names or [])
        config |= {
            "num_labels": len(names),
            "id2label": dict(enumerate(names)),
            "label2id": {n: i for i, n in enumerate(names)},
        }
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return {"auto_class": AUTO_CLASSES[kind], "dtype": dtype, "config": config}


def _tie_adapter(folder: Path, source: Any) -> None:
    """adapter_config.json: the base's id and exact commit instead of a local path (P4)."""
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = source.name
    config["revision"] = source.resolved_commit or source.revision
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(
        json.dumps(obj, indent=2, ensure_ascii=False, default=str, allow_nan=True) + "\n",
        encoding="utf-8",
    )


def export_model(
    model: Any,
    tokenizer: Any,
    campaign: Campaign,
    model_source: Any,
    out_dir: Path,
    *,
    data_version: str,
    metrics: dict[str, Any],
    control_examples: list[Example],
    encoder: Any,
    run_id: str,
    extra_files: dict[str, Any] | None = None,
    predictions: list[Any] | None = None,
    audit: dict[str, Any] | None = None,
    merge: bool = False,
    card_facts: Any = None,
) -> Path:
    """Write the bundle of `model` into `out_dir` (which must not exist); returns `out_dir`.

    `extra_files` maps a file name to its content: `.json` names are written as JSON, `.md`,
    `.txt` and `.yaml` names as text (e.g. {"comparison.json": {...}}). `predictions` (the
    run's validation predictions) give the card's metrics their intervals; `merge` also writes
    the adapter merged into its base under `merged/` (a full model in the base's dtype).
    `card_facts` (card_facts.CardFacts) is what the model card states beyond the run's
    metrics: data, training procedure, sealed test, comparison, license and language.
    """
    from tunepilot.deliver.controls import compute_controls
    from tunepilot.measure.env import fingerprint

    out_dir = Path(out_dir).resolve()
    _refuse_existing(out_dir)
    kind = encoder.kind
    labels = list(encoder.label_names) if kind == "classification" else None
    controls = compute_controls(
        model, encoder, control_examples, campaign.training.max_new_tokens
    )  # before any saving (R2)
    control_tensors = controls.pop("tensors", None)
    if campaign.hypothesis.task == "image_classification":
        kind = "image_classification"
    weights = "adapter" if _is_peft(model) else "full"
    spec = {
        "format": FORMAT,
        "run_id": run_id,
        "campaign": campaign.name,
        "task": campaign.hypothesis.task,
        "behaviour": campaign.hypothesis.behaviour,
        "model_kind": kind,
        "weights": weights,
        "method": campaign.model.method,
        "load": _load_spec(model, kind, labels),
        "labels": labels,
        "data_version": data_version,
        "template": campaign.data.template if kind == "causal_lm" else None,
        "chat": campaign.data.chat.model_dump(mode="json") if campaign.data.chat else None,
        "tunepilot_version": _tunepilot_version(),
        "merged": "merged" if merge and weights == "adapter" else None,
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)  # left by an earlier export of this process id
    tmp.mkdir()
    try:
        with quiet_transformers():  # its "Writing model shards" bar is noise in a log
            if weights == "adapter":
                from tunepilot.train.checkpoint import embedding_layers_to_save

                model.save_pretrained(str(tmp), safe_serialization=True,
                                      save_embedding_layers=embedding_layers_to_save(model))
                _tie_adapter(tmp, model_source)
            else:
                model.save_pretrained(str(tmp))  # transformers 5 writes safetensors only
            if campaign.data.chat and campaign.data.chat.chat_template_jinja:
                tokenizer.chat_template = campaign.data.chat.chat_template_jinja  # as trained
            tokenizer.save_pretrained(str(tmp))
            if spec["merged"]:
                from tunepilot.deliver.merge import save_merged

                save_merged(model, tokenizer, tmp / spec["merged"])
        resolved = {**campaign.model_dump(mode="json"), "_export": {"run_id": run_id}}
        (tmp / "campaign.resolved.yaml").write_text(
            yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True), encoding="utf-8"
        )
        _write_json(tmp / "base.json", model_source.to_json())
        env = fingerprint()
        _write_json(tmp / "env.json", env)
        _write_json(tmp / "bundle.json", spec)
        _write_json(
            tmp / "metrics.json",
            {"run_id": run_id, "data_version": data_version, "metrics": metrics},
        )
        _write_json(tmp / "control.json", controls)
        if control_tensors:
            from safetensors.torch import save_file

            save_file(control_tensors, str(tmp / IMAGES_FILE))
        for name, content in (extra_files or {}).items():
            _write_extra(tmp, name, content)
        card = model_card(spec, model_source, out_dir.name, metrics, controls, predictions,
                          audit, campaign, env, card_facts)  # fmt: skip
        (tmp / "README.md").write_text(card, encoding="utf-8")
        unsafe = [
            f"{p.name}: {r}" for p in tmp.rglob("*") if p.is_file() and (r := unsafe_reason(p))
        ]
        if unsafe:  # e.g. a library that wrote a pickle: never publish it (R4)
            raise RuntimeError(f"the export produced files a bundle must not hold: {unsafe}")
        _plain_modes(tmp)
        write_manifest(tmp, FORMAT)
        _refuse_existing(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _plain_modes(folder: Path) -> None:
    """Every file of the bundle gets the mode a plain file gets here (0644 under umask 022):
    safetensors writes its files 0600, so a colleague given the bundle could read its README
    but not its weights."""
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~mask)


def gather_card_facts(
    ws: Workspace, campaign: Campaign, row: Any, run_folder: Path, evaluations: list[Any],
    test: Any, looks: int, n_train: int,
) -> Any:  # fmt: skip
    """What the card states beyond the metrics, and the bundle's comparison.json (L5)."""
    from tunepilot.deliver import card_facts as cf
    from tunepilot.deliver.comparison import bundle_comparison
    from tunepilot.experiments.compare import HEADLINES

    facts = cf.CardFacts(
        data=cf.data_facts(ws, campaign, row.data_version),
        training=cf.training_facts(campaign, row, n_train),
        curve=cf.validation_curve(evaluations, HEADLINES[campaign.hypothesis.task]),
        test=test, test_looks=looks, comparison=bundle_comparison(ws, row.id),
        run_env=cf.read_run_env(run_folder),
    )
    facts.license, facts.language = cf.license_and_language(campaign, ws.model_source.path)
    return facts


def _refuse_existing(out_dir: Path) -> None:
    if out_dir.exists():
        raise input_error(
            str(out_dir),
            "an export already exists there; exports are never overwritten",
            "choose another folder with --out, or move the old one away",
            title="export refused",
        )


def _write_extra(folder: Path, name: str, content: Any) -> None:
    if Path(name).name != name or name in (MANIFEST, "README.md"):
        raise ValueError(f"extra file name {name!r} must be a plain, unreserved file name")
    if name.endswith(".json"):
        _write_json(folder / name, content)
    elif name.endswith((".md", ".txt", ".yaml")) and isinstance(content, str):
        (folder / name).write_text(content, encoding="utf-8")
    else:
        raise ValueError(f"extra file {name!r}: give .json content or .md/.txt/.yaml text")


def _tunepilot_version() -> str:
    from tunepilot import __version__

    return __version__


def export_run(
    ws: Workspace, run_id: str, out: Path | None = None, merge: bool = False
) -> Path:
    """Export a completed run's latest checkpoint to `out` (default exports/<run-id>); a
    relative `out` is inside the campaign folder, like every path the ledger keeps."""
    from tunepilot.deliver.card_facts import sealed_test
    from tunepilot.deliver.controls import choose_controls
    from tunepilot.experiments.guards import run_guards
    from tunepilot.experiments.runner import Session, load_trained_model
    from tunepilot.ledger import Ledger

    out_dir = ws.exports_dir / run_id if out is None else (
        Path(out) if Path(out).is_absolute() else ws.root / out)  # fmt: skip
    _refuse_existing(out_dir.resolve())
    with Ledger.open(ws.ledger_path) as ledger:
        row = ledger.get_run(run_id)
        if row.status != "completed":
            raise input_error(
                f"run {run_id}",
                f"its status is {row.status} ({row.reason}); only completed runs are exported",
                f"finish it (`tunepilot resume "
                f"{run_id}`) or pick a completed run (`tunepilot runs`)",
                title="export refused",
            )
        session = Session(ws)
        model, campaign, checkpoint = load_trained_model(session, ledger, run_id)
        evaluations = ledger.evaluations(run_id=run_id)
        validation = [e for e in evaluations if e.split == "validation"]
        predictions = ledger.predictions(validation[-1].id) if validation else []
        guards = run_guards(campaign, ledger, run_id)
        test, looks = sealed_test(ledger, run_id)
        run_folder = ledger.run_folder(row)
    encoded = session.encoded(campaign)
    metrics = {
        "final_validation": validation[-1].metrics if validation else {},
        "evaluations": [
            {
                "split": e.split,
                "update": e.update,
                "metrics": e.metrics,
                "eval_config_hash": e.eval_config_hash,
                "data_version": e.data_version,
                "test_look": e.test_look,
            }
            for e in evaluations
        ],
        "guards": [f.to_json() for f in guards],
        "fails_guards": [f"{f.check}: {f.sentence}" for f in guards if f.verdict is Verdict.FAIL],
    }
    run_info = {
        "run_id": run_id, "variant": row.variant, "seed": row.seed, "status": row.status,
        "reason": row.reason, "config_hash": row.config_hash, "checkpoint": checkpoint.name,
        "data_version": row.data_version, "data_version_at_export": encoded.prepared.version,
    }  # fmt: skip
    facts = gather_card_facts(ws, campaign, row, run_folder, evaluations, test, looks,
                              len(encoded.prepared.splits["train"]))  # fmt: skip
    extras = bundle_extras(run_info, model) | {"comparison.json": facts.comparison}
    # A full disk or a file-size limit (safetensors, tokenizers and plain writes each say it
    # their own way) is one sentence naming the bundle and the size of its weights.
    weights = sum(f.stat().st_size for f in checkpoint.glob("*model.safetensors"))
    with writing(out_dir, weights, f"`tunepilot export {run_id}` again"):
        return export_model(
            model,
            ws.tokenizer,
            campaign,
            ws.model_source,
            out_dir,
            data_version=row.data_version,
            metrics=metrics,
            control_examples=choose_controls(encoded.prepared.splits["validation"]),
            encoder=encoded.encoder,
            run_id=run_id,
            extra_files=extras,
            predictions=predictions,
            audit=read_audit(ws.root, row.data_version),
            merge=merge,
            card_facts=facts,
        )
