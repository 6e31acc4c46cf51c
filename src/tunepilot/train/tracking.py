"""Copies of a run's records for the trackers a team already reads: TensorBoard, MLflow and
Weights & Biases.

`tracking: [tensorboard, mlflow, wandb]` in the campaign turns them on (all off by default).
Each goes through the library's own API and needs no server:

* TensorBoard: `torch.utils.tensorboard.SummaryWriter`, one folder per run under
  `<campaign>/tracking/tensorboard/<run-id>/`; view them all with
  `tensorboard --logdir <campaign>/tracking/tensorboard`.
  Scalars are float32 tensors, the one scalar type TensorBoard's default (fast) loader,
  its Rust data server, serves: a double-precision scalar is dropped there and only shows
  with `--load_fast=false`. The ledger keeps every number in full precision; TensorBoard shows
  it rounded to float32. A resumed run purges the steps after its checkpoint (`purge_step`),
  as its JSONL files do.
* MLflow: a local SQLite store `<campaign>/tracking/mlflow.db`, one experiment per campaign,
  one MLflow run per tunepilot run (a resume continues the same MLflow run). MLflow cannot
  delete metric points, so a resumed run's history also keeps the steps of the lost future
  (the ledger's `curve` is the one to trust; MLflow's UI shows the latest value per step).
* Weights & Biases: `wandb.init` with the campaign as project (`WANDB_PROJECT` picks another)
  and the tunepilot run id as run name and group-by-variant. Without `WANDB_API_KEY` (and
  unless `WANDB_MODE` says otherwise) the run is offline: written to
  `<campaign>/tracking/wandb/offline-run-*/`, uploaded later with `wandb sync DIR`. The W&B run
  id is the tunepilot run id plus a hash of the campaign folder, so a resume continues it.
  W&B, like MLflow, keeps the first value logged at a step: after a resume the lost future's
  points stay (the ledger's curve is the one to trust). Console capture, git, code and
  system-metrics collection are off: the run's own records are what it receives.

The run's identity (hypothesis, variant, seed, data version, config hash) goes in as params
and tags. Both are copies: a tracker that fails is switched off with one warning
(`train.records.Records`) and never fails the run.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACKERS = ("tensorboard", "mlflow", "wandb")
# How long an online W&B run may wait for its server before the tracker is switched off for
# that run (its default is 90 s; the run waits for nothing else from a tracker).
WANDB_INIT_TIMEOUT_S = 10.0
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_.\- /]")  # MLflow's allowed metric-name characters


@dataclass
class RunInfo:
    """What a tracker shows next to the curves: which run, of what, on which data."""

    run_id: str
    campaign: str
    params: dict[str, Any] = field(default_factory=dict)  # flat, JSON-able values
    tags: dict[str, str] = field(default_factory=dict)


def update_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The per-update figures a tracker plots: loss, lr, grad norm and throughput."""
    out = {f"train/{key}": float(record[key]) for key in ("loss", "lr", "grad_norm", "epoch")
           if isinstance(record.get(key), int | float)}  # fmt: skip
    seconds = record.get("update_seconds")
    if isinstance(seconds, int | float) and seconds > 0:
        out["train/examples_per_second"] = record["examples"] / seconds
        out["train/target_tokens_per_second"] = record["loss_tokens"] / seconds
    return out


def eval_scalars(metrics: dict[str, Any], prefix: str = "eval") -> dict[str, float]:
    """Every number in an evaluation's (nested) metrics, keyed by its path: eval/f1/refunds."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}/{_KEY_UNSAFE.sub('_', str(key))}"
        if isinstance(value, dict):
            out.update(eval_scalars(value, name))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, folder: Path, info: RunInfo) -> None:
        self.folder, self.info = folder, info
        self.writer: Any = None

    def start(self, update: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.folder), purge_step=update + 1 if update else None)
        if not update:
            rows = "\n".join(f"| {k} | {v} |" for k, v in {**self.info.tags,
                                                          **self.info.params}.items())
            self.writer.add_text("run", f"| key | value |\n|---|---|\n{rows}", 0)

    def update(self, record: dict[str, Any]) -> None:
        self._scalars(update_scalars(record), record["update"])

    def evaluation(self, update: int, metrics: dict[str, Any]) -> None:
        self._scalars(eval_scalars(metrics), update)

    def close(self, status: str) -> None:
        if self.writer is not None:
            self.writer.close()

    def _scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step, new_style=True)  # float32: see above
        self.writer.flush()


class MlflowSink:
    name = "mlflow"

    def __init__(self, store: Path, info: RunInfo) -> None:
        self.store, self.info = store, info
        self.client: Any = None
        self.mlflow_run: str | None = None

    def start(self, update: int) -> None:
        from mlflow.tracking import MlflowClient

        for noisy in ("mlflow", "alembic"):  # table creation logs at INFO on every new store
            logging.getLogger(noisy).setLevel(logging.WARNING)

        self.store.parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=f"sqlite:///{self.store.resolve()}")
        experiment = self.client.get_experiment_by_name(self.info.campaign)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(
            self.info.campaign, artifact_location=(self.store.parent / "mlflow-artifacts").as_uri()
        )  # fmt: skip
        found = self.client.search_runs(
            [experiment_id], f"tags.`tunepilot.run_id` = '{self.info.run_id}'", max_results=1
        )
        if found:  # a resume: the same MLflow run goes on
            self.mlflow_run = found[0].info.run_id
            self.client.update_run(self.mlflow_run, status="RUNNING")
            return
        from mlflow.entities import Param, RunTag

        tags = {"tunepilot.run_id": self.info.run_id, **self.info.tags}
        run = self.client.create_run(experiment_id, tags=tags, run_name=self.info.run_id)
        self.mlflow_run = run.info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in self.info.params.items()]
        self.client.log_batch(self.mlflow_run, params=params,
                              tags=[RunTag(k, v) for k, v in tags.items()])  # fmt: skip

    def update(self, record: dict[str, Any]) -> None:
        self._metrics(update_scalars(record), record["update"])

    def evaluation(self, update: int, metrics: dict[str, Any]) -> None:
        self._metrics(eval_scalars(metrics), update)

    def close(self, status: str) -> None:
        if self.client is not None and self.mlflow_run is not None:
            ended = {"completed": "FINISHED", "failed": "FAILED", "diverged": "FAILED",
                     "stopped_loss_bound": "FAILED"}.get(status, "KILLED")  # fmt: skip
            self.client.set_tag(self.mlflow_run, "tunepilot.status", status)
            self.client.set_terminated(self.mlflow_run, status=ended)

    def _metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in values.items() if not math.isnan(v)]
        self.client.log_batch(self.mlflow_run, metrics=batch)


class WandbSink:
    name = "wandb"

    def __init__(self, folder: Path, info: RunInfo) -> None:
        self.folder, self.info = folder, info
        self.run: Any = None

    def start(self, update: int) -> None:
        import hashlib
        import os

        import wandb

        self.folder.mkdir(parents=True, exist_ok=True)
        mode = os.environ.get("WANDB_MODE") or (
            "online" if os.environ.get("WANDB_API_KEY") else "offline")  # fmt: skip
        place = hashlib.sha256(str(self.folder.resolve()).encode()).hexdigest()[:8]
        tags = {"tunepilot.run_id": self.info.run_id, **self.info.tags}
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or self.info.campaign,
            id=f"{self.info.run_id}-{place}", name=self.info.run_id,
            group=self.info.tags.get("variant"), job_type="train", dir=str(self.folder),
            mode=mode, resume="allow", reinit="create_new",
            config={**self.info.params, "tags": tags},
            tags=[f"{k}:{v}"[:64] for k, v in tags.items() if k != "hypothesis"],
            notes=self.info.tags.get("hypothesis"),
            settings=wandb.Settings(console="off", silent=True, disable_git=True,
                                    save_code=False, x_disable_stats=True,
                                    x_disable_machine_info=True, x_save_requirements=False,
                                    init_timeout=WANDB_INIT_TIMEOUT_S),
        )  # fmt: skip

    def update(self, record: dict[str, Any]) -> None:
        self.run.log(update_scalars(record), step=record["update"])

    def evaluation(self, update: int, metrics: dict[str, Any]) -> None:
        self.run.log(eval_scalars(metrics), step=update)

    def close(self, status: str) -> None:
        if self.run is not None:
            self.run.summary["tunepilot.status"] = status
            self.run.finish(exit_code=0 if status == "completed" else 1)


def open_trackers(names: list[str], root: Path, info: RunInfo) -> list[Any]:
    """The sinks a campaign asked for, under `<root>/tracking/`; nothing is opened yet."""
    folder = root / "tracking"
    made: dict[str, Any] = {
        "tensorboard": lambda: TensorBoardSink(folder / "tensorboard" / info.run_id, info),
        "mlflow": lambda: MlflowSink(folder / "mlflow.db", info),
        "wandb": lambda: WandbSink(folder, info),
    }
    return [made[name]() for name in names]
