"""A real sweep on a tiny BERT, end to end through runner.execute_run (V1-V7, H2, H3).

Two learning rates x two seeds, a variant with a huge learning rate that diverges, one run
stopped mid-way and left interrupted (then retried under a new id): `compare` must keep every
line with its reason and end with a decision. A few seconds on 2 CPU cores.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tunepilot.data.workspace import Workspace
from tunepilot.experiments.compare import compare_command
from tunepilot.ledger import Ledger

WORDS = {
    "refund": ["refund", "charged twice", "money back"],
    "delivery": ["order", "arrived", "delivery address"],
    "cancel": ["cancel", "subscription", "no longer need"],
}


def write_sweep_campaign(folder: Path, base_model: Path, n: int = 90) -> Path:
    """A small ticket-routing campaign on `base_model` (a tiny BERT folder): 3 classes,
    stratified 60/20/20 split with a sealed test, 12 updates of 4 x 2 examples."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    with (folder / "data.jsonl").open("w", encoding="utf-8") as handle:
        for i in range(n):
            label = list(WORDS)[i % 3]
            text = f"{rng.choice(WORDS[label])} please {rng.choice(WORDS[label])} {i}"
            handle.write(json.dumps({"id": f"e{i}", "text": text, "label": label}) + "\n")
    path = folder / "campaign.yaml"
    path.write_text(
        f"""name: sweep
hypothesis: {{behaviour: route tickets, task: classification}}
model:
  name_or_path: {base_model}
  lora: {{r: 4, target_modules: [query, value], modules_to_save: [classifier]}}
data:
  file: data.jsonl
  fields: {{id: id, text: text, label: label}}
  split: {{policy: stratified, validation: 0.2, test: 0.2}}
  max_length: 32
training:
  microbatch: 4
  accumulation: 2
  budget: {{updates: 12}}
  lr: 1.0e-3
  warmup_updates: 0
  eval_every: 6
  eval_batch_size: 16
  stop: {{max_loss: 5.0}}
variants:
  lr-2e-3: {{explain: "Double the learning rate", overrides: {{training.lr: 2.0e-3}}}}
  lr-huge: {{explain: "A learning rate far too large", overrides: {{training.lr: 0.9}}}}
seeds: [0, 1]
""",
        encoding="utf-8",
    )
    return path


def test_v3_v7_sweep_reports_diverged_and_interrupted_runs_with_reasons_and_decides(
    tmp_path: Path, tiny_bert_dir: Path, capsys
):
    from tunepilot.experiments.baseline import run_baseline
    from tunepilot.experiments.runner import Session, execute_run

    ws = Workspace.open(write_sweep_campaign(tmp_path / "c", tiny_bert_dir))
    session = Session(ws)
    with Ledger.open(ws.ledger_path) as ledger:
        run_baseline(session, ledger)
        outcomes = {}
        for name in ("control", "lr-2e-3"):
            for seed in (0, 1):
                stop = 3 if (name, seed) == ("lr-2e-3", 1) else None
                o = execute_run(session, ledger, name, seed, stop_after=stop, progress=False)
                outcomes[o.run_id] = o
        huge = execute_run(session, ledger, "lr-huge", 0, progress=False)
        retry = execute_run(session, ledger, "lr-2e-3", 1, retry_of="lr-2e-3-s1-1",
                            progress=False)  # fmt: skip
        runs = {r.id: r for r in ledger.list_runs()}
    assert {k: r.status for k, r in runs.items()} == {
        "control-s0-1": "completed", "control-s1-1": "completed",
        "lr-2e-3-s0-1": "completed", "lr-2e-3-s1-1": "interrupted",
        "lr-huge-s0-1": "diverged", "lr-2e-3-s1-2": "completed",
    }  # fmt: skip
    assert huge.status == "diverged" and "> stop.max_loss" in huge.reason
    assert retry.run_id == "lr-2e-3-s1-2" and runs["lr-2e-3-s1-2"].retry_of == "lr-2e-3-s1-1"

    assert compare_command(ws, as_json=False) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "lr-huge-s0-1" in shown and "lr-2e-3-s1-1" in shown  # listed, not dropped (V3)
    saved = json.loads((ws.root / "comparison.json").read_text(encoding="utf-8"))
    lines = {r["run_id"]: r for v in saved["variants"] for r in v["runs"]}
    assert set(lines) == set(runs)
    assert lines["lr-huge-s0-1"]["excluded"] == f"diverged: {huge.reason}"
    assert lines["lr-2e-3-s1-1"]["excluded"].startswith(
        "interrupted: paused after update 3 as asked (stop_after)"
    )
    assert lines["lr-2e-3-s1-2"]["excluded"] is None  # the retry stands for seed 1
    by_name = {v["name"]: v for v in saved["variants"]}
    assert by_name["lr-2e-3"]["ci"]["seeds"] == [0, 1]
    assert set(by_name["control"]["summary"]["macro_f1"]["values"]) == {"0", "1"}
    assert by_name["control"]["guards"] and "vs_baseline" in by_name["lr-2e-3"]["deltas"]
    decision = saved["decision"]
    assert decision.startswith(("Adopt `lr-2e-3`", "Keep the control"))
    assert "`lr-huge`: no comparable completed run (lr-huge-s0-1 diverged: update" in decision
    assert saved["adopted"] in (None, "lr-2e-3")
