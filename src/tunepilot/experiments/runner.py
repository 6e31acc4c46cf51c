"""One run of one variant and seed, start to finish, with everything it saw written down.

The chain (DESIGN): campaign -> data -> task encoding -> model -> loop -> ledger. A run gets a
stable id from the ledger, a folder with its resolved config, backend fingerprint and data
version, a status history (planned, running, then completed / diverged / interrupted /
failed, each with a reason), its curve, and a final evaluation with per-example predictions
through the same procedure every variant uses (V2, V3, V5). A crash still leaves a `failed`
row with the error; a killed process is found by the next command and marked interrupted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tunepilot.campaign import Campaign
from tunepilot.campaign.variants import CONTROL, variant_campaign, variant_diff
from tunepilot.data.workspace import Workspace
from tunepilot.experiments.evaluate import pad_id_of
from tunepilot.model.base_dtype import QUANTIZED

# How the loop's end states are recorded in the ledger (V3: every end has a reason).
LEDGER_STATUS = {
    "completed": "completed",
    "stopped_wall_clock": "completed",
    "diverged": "diverged",
    "stopped_loss_bound": "diverged",
    "paused": "interrupted",
    "stopped": "interrupted",  # SIGTERM or Ctrl-C, checkpoint saved at an update boundary
}
# One rule for outcomes (README, exit codes): a run that ended in one of these is a failed
# check, exit 1; completed, or paused as asked with --stop-after, is exit 0.
FAILED_STATUSES = frozenset({"diverged", "failed", "invalid"})


def outcome_code(statuses: Any) -> int:
    """The exit code of a command that ran these runs: 1 if any ended badly, else 0."""
    return 1 if any(s in FAILED_STATUSES for s in statuses) else 0


@dataclass
class Encoded:
    """The data of a campaign as the model sees it, shared by every run with that encoding."""

    prepared: Any
    encoder: Any
    train: list[Any]
    validation: list[Any]


@dataclass
class RunOutcome:
    run_id: str
    status: str
    reason: str
    updates: int
    run_dir: Path
    metrics: dict[str, Any] = field(default_factory=dict)
    update_seconds: list[float] = field(default_factory=list)


class Session:
    """The heavy parts of a campaign (data, tokenizer, encodings), built once for many runs."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self._encodings: dict[str, Encoded] = {}
        self.new_weights: list[str] = []  # of the last model built: not in the checkpoint

    def encoded(self, campaign: Campaign) -> Encoded:
        """Encode the splits for a (variant) campaign; reused while the encoding is the same."""
        from tunepilot.campaign import stable_hash
        from tunepilot.tasks import make_encoder

        key = stable_hash([campaign.data.model_dump(mode="json"), campaign.model.name_or_path])
        if key not in self._encodings:
            self.ws.refuse_beyond_positions(campaign.data.max_length)  # S6, before an id
            prepared = (
                self.ws.prepare()
                if campaign.data == self.ws.campaign.data
                else _prepare_for(self.ws, campaign)
            )
            encoder = make_encoder(
                campaign, self.ws.tokenizer, prepared.label_names, self.ws.root
            )
            augmented = encoder.training_view()
            train = [augmented.encode(e) for e in prepared.splits["train"]]
            validation = [encoder.encode(e) for e in prepared.splits["validation"]]
            self._encodings[key] = Encoded(prepared, encoder, train, validation)
        return self._encodings[key]

    def build_model(self, campaign: Campaign, seed: int, device: str | None = None) -> Any:
        """Base + head + method, initialised from `seed` so a run is reproducible from its id,
        on `device` (None: `train_device()`, the first GPU when there is one): the loop, the
        evaluation and the checkpoint loader all work on the device the weights are on."""
        from tunepilot.model.build import apply_method, load_model
        from tunepilot.model.lora_init import seed_lora
        from tunepilot.train.rng import seed_everything

        encoded = self.encoded(campaign)
        kind = "classification" if campaign.hypothesis.is_classification else "causal_lm"
        if campaign.hypothesis.task == "image_classification":
            kind = "image_classification"
        seed_everything(seed)  # the new head and LoRA's A matrices draw from here
        device = device or train_device()
        loaded = load_model(
            self.ws.model_source, kind, campaign.model, encoded.prepared.label_names or None,
            pad_token_id=getattr(self.ws.tokenizer, "pad_token_id", None),
            device_type=device.split(":")[0], device=device,
        )  # fmt: skip
        self.new_weights = list(loaded.new_keys)
        model = apply_method(loaded, campaign.model, campaign.training.weights_dtype)
        seed_lora(model, seed)  # the same adapter start whatever builds it (lora_init.py)
        # PEFT writes the base's path into every checkpoint's adapter_config.json and card: the
        # campaign's own name for it (a hub id, or a path relative to the campaign folder), so a
        # copied folder holds no path into the original.
        for adapter in (getattr(model, "peft_config", None) or {}).values():
            adapter.base_model_name_or_path = campaign.model.name_or_path
        if loaded.base_dtype not in QUANTIZED:  # a quantized base was loaded onto `device`
            model.to(device)
        return model

    def evaluate(
        self, model: Any, campaign: Campaign, examples: list[Any] | None = None,
        label: str | None = None, ranks: tuple[int, int, bool] | None = None,
    ) -> Any:  # fmt: skip
        """The one evaluation procedure (V2) on the validation split unless told otherwise.
        `ranks` (rank, world size, forwards are collectives) shares it over data-parallel
        ranks, each of which ends with the whole result (evaluate_sharded.py)."""
        from tunepilot.experiments.evaluate_sharded import evaluate_on_ranks
        from tunepilot.train.loss import eval_chunks

        encoded = self.encoded(campaign)
        split = examples if examples is not None else encoded.prepared.splits["validation"]
        t = campaign.training
        chunks = eval_chunks(t.loss_chunks, t.microbatch, t.eval_batch_size)
        result = evaluate_on_ranks(model, encoded.encoder, split, t.eval_batch_size,
                                   t.max_new_tokens, _device_of(model), label, ranks,
                                   chunks)  # fmt: skip
        # what this encoding did to the training answers, judged by compare (S6)
        result.metrics["train_answers_cut"] = sum(e.target_truncated for e in encoded.train)
        return result


def _prepare_for(ws: Workspace, campaign: Campaign) -> Any:
    from tunepilot.data.prepare import prepare_data

    return prepare_data(campaign, ws.root, write=True)


def train_device() -> str:
    """The device a single-process run is measured on: the first GPU, else the CPU (the
    pilot's rule)."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def _device_of(model: Any) -> str:
    return str(next(model.parameters()).device)


def model_kind(campaign: Campaign) -> str:
    return "classification" if campaign.hypothesis.is_classification else "causal_lm"


def run_campaign_for(ws: Workspace, variant: str, seed: int) -> Campaign:
    """The campaign a run trains: the variant's overrides, then its seed."""
    from tunepilot.train.runtime import on_this_machine

    campaign = variant_campaign(ws.campaign, variant)
    training = on_this_machine(campaign.training).model_copy(update={"seed": seed})
    return campaign.model_copy(update={"training": training})


def write_run_files(run_dir: Path, campaign: Campaign, extra: dict[str, Any]) -> None:
    """config.resolved.yaml and env.json next to every run (STYLE 8, B2)."""
    from tunepilot.measure.env import fingerprint, git_commit

    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = {**campaign.model_dump(mode="json"), "_run": extra}
    (run_dir / "config.resolved.yaml").write_text(
        yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True), encoding="utf-8"
    )
    from tunepilot.model.base_dtype import default_device_type
    from tunepilot.train.runtime import runtime_record

    env = fingerprint()
    env["campaign_git_commit"] = git_commit(run_dir.parent.parent)
    env["runtime"] = runtime_record(campaign.training, default_device_type())  # the choices
    (run_dir / "env.json").write_text(json.dumps(env, indent=2, default=str), encoding="utf-8")


def trackers_for(
    ws: Workspace, campaign: Campaign, run_id: str, variant: str, seed: int, data_version: str
) -> list[Any]:
    """The trackers the campaign turned on (`tracking:`), told which run this is."""
    from tunepilot.train.tracking import RunInfo, open_trackers

    if not campaign.tracking:
        return []
    t, m = campaign.training, campaign.model
    identity = {"variant": variant, "seed": seed, "data_version": data_version,
                "config_hash": campaign.config_hash(),
                "task": campaign.hypothesis.task}  # fmt: skip
    params = {**identity, "lr": t.lr, "microbatch": t.microbatch, "accumulation": t.accumulation,
              "scheduler": t.scheduler, "precision": t.precision, "method": m.method,
              "base_model": m.name_or_path,  # the commit it resolved to (P4), never "None"
              "base_revision": ws.model_source.resolved_commit or m.revision}  # fmt: skip
    params = {k: v for k, v in params.items() if v is not None}
    if m.method == "lora":
        params.update(lora_r=m.lora.r, lora_alpha=m.lora.alpha,
                      lora_target_modules=",".join(m.lora.target_modules))  # fmt: skip
    tags = {"hypothesis": campaign.hypothesis.behaviour,
            **{k: str(v) for k, v in identity.items()}}  # fmt: skip
    info = RunInfo(run_id, ws.campaign.name, params, tags)
    return open_trackers(list(campaign.tracking), ws.root, info)


def execute_run(
    session: Session,
    ledger: Any,
    variant: str = CONTROL,
    seed: int = 0,
    *,
    resume_run_id: str | None = None,
    retry_of: str | None = None,
    stop_after: int | None = None,
    progress: bool | None = None,
    from_step: int | None = None,
    place: str = "",
) -> RunOutcome:
    """Train one variant x seed (or resume one) and record everything in the ledger.

    `place` ("run 2 of 6") goes in front of the progress line, so a person watching a sweep
    knows how far it is.

    `from_step` resumes from that checkpoint instead of the newest one that verifies. A
    refusal (bad input, a checkpoint that does not verify) or a storage fault leaves the run
    `interrupted`, resumable once the cause is fixed; SIGTERM or Ctrl-C saves a checkpoint at
    the update boundary, records the stop and raises `Stopped`.
    """
    from tunepilot.experiments.recovery import failure_reason, next_step, record_end, resume_source
    from tunepilot.measure.phase_log import PhaseLog
    from tunepilot.train.loop import train
    from tunepilot.train.packing import packing_of
    from tunepilot.train.stopping import StopSignals

    ws = session.ws
    resume_from: Path | None = None
    if resume_run_id is not None:
        row = ledger.get_run(resume_run_id)
        variant, seed, run_id = row.variant, row.seed, row.id
        resume_from = resume_source(ws, run_id, ledger.run_folder(row), from_step)
    campaign = run_campaign_for(ws, variant, seed)
    from tunepilot.train.runtime import require_backends

    require_backends(campaign.model, campaign.training)  # before an id is reserved
    encoded = session.encoded(campaign)
    data_version = encoded.prepared.version
    if resume_run_id is None:  # the id and its runs row land in one transaction
        if retry_of:  # a new id pointing at the original, which keeps its line (V3)
            run_id = ledger.retry(retry_of, reason="retry requested")
        else:
            run_id = ledger.register_run(
                campaign=ws.campaign.name, variant=variant, seed=seed,
                config_hash=campaign.config_hash(), data_version=data_version,
                control_run=control_run_for(ledger, seed) if variant != CONTROL else None,
                diff=variant_diff(ws.campaign, variant),
                budget=campaign.training.budget.model_dump(),
            )  # fmt: skip
    run_dir = ledger.run_folder(run_id)
    ledger.set_status(run_id, "running", f"pid {os.getpid()}", pid=os.getpid())
    ledger.heartbeat(run_id, pid=os.getpid())

    def on_update(record: dict[str, Any]) -> None:
        ledger.record_update(run_id, record["update"], record["loss"], lr=record["lr"])
        ledger.heartbeat(run_id, pid=os.getpid())

    last_eval: list[Any] = []  # the loop always evaluates the final weights; keep that one

    def evaluate_point(model: Any) -> dict[str, Any]:  # shown under training's own progress
        label = f"validation of {run_id}" if progress is not False else None
        last_eval[:] = [session.evaluate(model, campaign, label=label)]
        return last_eval[0].metrics

    try:
        with StopSignals() as stop:
            if resume_from is None:
                write_run_files(run_dir, campaign, {
                    "run_id": run_id, "variant": variant, "seed": seed,
                    "data_version": data_version, "retry_of": retry_of})  # fmt: skip
            phases = PhaseLog.for_run(run_dir, train_device())  # memory per phase (S5)
            with phases.phase("load"):
                model = session.build_model(campaign, seed)
            if resume_from is None:
                record_trainable(ledger, run_id, run_dir, model)
            result = train(
                model, encoded.train, campaign.training, run_dir, kind=model_kind(campaign),
                pad_id=pad_id_of(ws.tokenizer), evaluate=evaluate_point, resume=resume_from,
                on_update=on_update, progress=progress, stop_after=stop_after, stop=stop,
                label=f"{place + ': ' if place else ''}training {run_id}", phases=phases,
                sinks=trackers_for(ws, campaign, run_id, variant, seed, data_version),
                packing=packing_of(campaign),
            )  # fmt: skip
    except KeyboardInterrupt:
        record_end(ledger, run_id, "interrupted",
                    f"stopped from the keyboard; {next_step(ws, run_id, run_dir)}")  # fmt: skip
        raise
    except Exception as exc:
        record_end(ledger, run_id, *failure_reason(ws, run_id, run_dir, exc))
        raise
    if result.refused and result.resumed_from is not None:  # said on stderr by the loop too
        from tunepilot.ledger.paths import relative_text

        ledger.add_note(relative_text(ws.root, f"{run_id} resumed from {result.resumed_from.name}"
                                      f": {'; '.join(result.refused)}"), run_id=run_id)

    status = LEDGER_STATUS[result.status]
    metrics: dict[str, Any] = {}
    if status == "completed":
        final = last_eval[0] if last_eval else session.evaluate(model, campaign)
        metrics = final.metrics
        ledger.record_evaluation(
            run_id, "validation", final.metrics, eval_config_hash=final.config_hash,
            data_version=data_version, update=result.updates,
            predictions=predictions_from_rows(final.rows),
        )  # fmt: skip
    reason = result.reason
    if result.status in ("paused", "stopped"):
        kept = result.last_checkpoint
        reason += f"; checkpoint {kept.name} saved" if kept else ""
        reason += f"; {next_step(ws, run_id, run_dir)}"
    ledger.set_status(run_id, status, reason)
    if result.status == "stopped":
        from tunepilot.errors import Stopped

        raise Stopped(f"{run_id}: {reason}", result.signal)
    return RunOutcome(run_id, status, reason, result.updates, run_dir, metrics,
                      result.update_seconds)


def record_trainable(ledger: Any, run_id: str, run_dir: Path, model: Any) -> None:
    """P2 for every run: runs/<id>/trainable.json (per module) and the totals in the ledger."""
    from tunepilot.model.params import trainable_report

    report = trainable_report(model).to_json()
    (run_dir / "trainable.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    ledger.record_fact(run_id, "trainable", {k: v for k, v in report.items() if k != "rows"})


def predictions_from_rows(rows: list[dict[str, Any]]) -> list[Any]:
    from tunepilot.ledger import Prediction

    out = []
    for row in rows:
        pred = row.get("pred", row.get("output"))
        score = row.get("correct", row.get("exact"))
        out.append(Prediction(
            example_id=str(row["id"]), gold=json.dumps(row.get("gold"), default=str),
            pred=json.dumps(pred, default=str),
            score=None if score is None else float(score), row=row,
        ))  # fmt: skip
    return out


def control_run_for(ledger: Any, seed: int) -> str | None:
    """The latest control run with the same seed, the one a variant is compared to."""
    rows = [r for r in ledger.list_runs() if r.variant == CONTROL and r.seed == seed]
    return rows[-1].id if rows else None


def load_trained_model(session: Session, ledger: Any, run_id: str) -> tuple[Any, Campaign, Path]:
    """Rebuild a run's model as it trained and load its latest checkpoint's weights (verified
    against the manifest first, R4). Used by export, the sealed test and the report."""
    from tunepilot.errors import input_error
    from tunepilot.train.checkpoint import latest_checkpoint, load_weights

    row = ledger.get_run(run_id)
    campaign = run_campaign_for(session.ws, row.variant, row.seed)
    run_dir = ledger.run_folder(row)  # under this campaign folder, never a recorded elsewhere
    folder = latest_checkpoint(run_dir)
    if folder is None:
        raise input_error(f"run {run_id}", f"no complete checkpoint under {run_dir}",
                          "resume the run to its end, or pick a completed run (`tunepilot runs`)")
    model = session.build_model(campaign, row.seed)
    load_weights(folder, model)
    return model, campaign, folder
