"""A campaign folder holding thousands of recorded runs, written through the ledger's own API
and laid out on disk as the runner lays it out, for the scale tests and benchmarks/bench_scale.py
(the report, `compare --json`). Nothing is trained: the runs' curves, final evaluations with
per-example predictions, resolved configs and environments are generated, deterministically.

Imported by tests (pytest puts this folder on sys.path) and by the benchmark.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml

LABELS = ("refund", "shipping", "login")
UPDATES = 12


def write_scale_campaign(folder: Path, model: str, n_variants: int, n_seeds: int,
                         n_examples: int = 60) -> Path:  # fmt: skip
    """`n_variants` learning-rate variants and the control, each on `n_seeds` seeds, every run
    recorded (one in fifty diverged, one in a hundred failed), a baseline, and the data version
    prepared: (1 + n_variants) x n_seeds runs in all. Returns the campaign file."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.ledger import BASELINE, Ledger, Prediction

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    with (folder / "data.jsonl").open("w", encoding="utf-8") as handle:
        for i in range(n_examples):
            label = LABELS[i % len(LABELS)]
            handle.write(json.dumps({"id": f"e{i}", "text": f"{label} ticket number {i}",
                                     "label": label}) + "\n")  # fmt: skip
    variants = {f"lr-{i}": {"explain": f"learning rate step {i}",
                            "overrides": {"training.lr": round(1e-4 * (1 + i / 10), 8)}}
                for i in range(n_variants)}  # fmt: skip
    campaign = {
        "name": "scale",
        "hypothesis": {"behaviour": "route tickets", "task": "classification"},
        "model": {"name_or_path": str(model),
                  "lora": {"r": 4, "target_modules": ["query", "value"],
                           "modules_to_save": ["classifier"]}},
        "data": {"file": "data.jsonl", "fields": {"id": "id", "text": "text", "label": "label"},
                 "split": {"policy": "stratified", "validation": 0.5, "test": 0.1},
                 "max_length": 32},
        "training": {"budget": {"updates": UPDATES}, "eval_every": 6},
        "variants": variants,
        "seeds": list(range(n_seeds)),
    }  # fmt: skip
    path = folder / "campaign.yaml"
    path.write_text(yaml.safe_dump(campaign, sort_keys=False), encoding="utf-8")
    ws = Workspace.open(path)
    prepared = ws.prepare(seal=False)
    validation = [(ex.id, ex.label) for ex in prepared.splits["validation"]]
    version = prepared.version

    def evaluation(skill: float) -> tuple[dict, list[Prediction]]:
        preds, tp = [], {x: 0 for x in LABELS}
        for eid, gold in validation:
            pred = gold if rng.random() < skill else rng.choice(LABELS)
            tp[gold] += pred == gold
            preds.append(Prediction(eid, json.dumps(gold), json.dumps(pred), float(pred == gold),
                                    {"id": eid, "gold": gold, "pred": pred,
                                     "correct": pred == gold}))  # fmt: skip
        accuracy = sum(tp.values()) / len(validation)
        per_class = {x: {"precision": accuracy, "recall": accuracy, "f1": accuracy,
                         "support": sum(g == x for _, g in validation)} for x in LABELS}
        metrics = {"macro_f1": accuracy, "accuracy": accuracy, "loss": 1.0 - accuracy,
                   "n": len(validation), "per_class": per_class}  # fmt: skip
        return metrics, preds

    with Ledger.open(ws.ledger_path) as ledger:
        ledger._conn.execute("PRAGMA synchronous=OFF")  # generated evidence: no fsync per row
        metrics, preds = evaluation(0.4)
        ledger.record_evaluation(BASELINE, "validation", metrics, eval_config_hash="eval-1",
                                 data_version=version, update=0, predictions=preds)  # fmt: skip
        for v, name in enumerate(["control", *variants]):
            # the runner writes the whole resolved campaign (every variant in it) per run
            resolved = yaml.safe_dump({**campaign, "training": {**campaign["training"],
                                       "seed": -1}, "_run": {"run_id": "RUN", "variant": name}})
            for seed in range(n_seeds):
                number = v * n_seeds + seed
                run_id = ledger.register_run(
                    campaign="scale", variant=name, seed=seed, config_hash=f"cfg-{v}-{seed}",
                    data_version=version, status="running", reason="generated",
                    diff={} if name == "control" else {"training.lr": [1e-4, v]},
                    budget={"updates": UPDATES})  # fmt: skip
                status = ("diverged" if number % 50 == 7 else
                          "failed" if number % 100 == 13 else "completed")  # fmt: skip
                losses = [2.0 / (1 + u * (0.1 + v % 7 / 100)) for u in range(1, UPDATES + 1)]
                if status == "diverged":
                    losses[-1] = float("nan")
                ledger.record_updates(run_id, [{"update": u, "loss": x, "lr": 1e-4}
                                               for u, x in enumerate(losses, 1)])  # fmt: skip
                run_dir = folder / "runs" / run_id
                run_dir.mkdir(parents=True)
                (run_dir / "metrics.jsonl").write_text("".join(
                    json.dumps({"update": u, "loss": None if x != x else x}) + "\n"
                    for u, x in enumerate(losses, 1)), encoding="utf-8")  # fmt: skip
                (run_dir / "config.resolved.yaml").write_text(
                    resolved.replace("seed: -1", f"seed: {seed}").replace("run_id: RUN",
                                                                          f"run_id: {run_id}"),
                    encoding="utf-8")  # fmt: skip
                (run_dir / "env.json").write_text(json.dumps(
                    {"python": {"version": "3.11"}, "torch": {"version": "2.13", "backend": "cpu"},
                     "cpu": {"model": "generated"}}), encoding="utf-8")  # fmt: skip
                if status != "completed":
                    ledger.set_status(run_id, status, f"{status} at update {UPDATES} (generated)")
                    continue
                metrics, preds = evaluation(0.6 + (v % 5) / 50)
                (run_dir / "evals.jsonl").write_text(json.dumps(
                    {"update": UPDATES, "eval": {k: metrics[k] for k in
                                                 ("macro_f1", "accuracy", "loss")}}) + "\n",
                    encoding="utf-8")  # fmt: skip
                ledger.record_evaluation(run_id, "validation", metrics, eval_config_hash="eval-1",
                                         data_version=version, update=UPDATES,
                                         predictions=preds)  # fmt: skip
                ledger.set_status(run_id, "completed", "budget of 12 updates reached")
    return path
