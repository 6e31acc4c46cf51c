"""`tunepilot plan` on an 8B LoRA campaign at 2 x 2048 tokens with activation checkpointing and
a bf16 base finds a 24 GB card that fits training AND evaluation (S1, L1, V2): the chunked
causal-LM loss keeps the step's logits small, and with `training.eval_batch_size` unset the
card's evaluation is sized at the largest batch that fits it (`sizing.eval_fit`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

GIB = 2**30
OVERRIDES = {"model.name_or_path": "llama-3-8b-config", "model.method": "lora",
             "model.lora.r": 8, "model.lora.alpha": 16, "model.lora.dropout": 0.0,
             "model.lora.target_modules": ["q_proj", "v_proj"], "model.lora.modules_to_save": [],
             "model.base_dtype": "bf16", "training.precision": "bf16",
             "training.microbatch": 2, "training.activation_checkpointing": True,
             "data.max_length": 2048}  # fmt: skip


@pytest.mark.slow  # about ten dry runs of an 8B step: ~40 s quiet
def test_s1_l1_an_8b_lora_step_at_2x2048_plans_on_a_24gb_card_training_and_evaluation(
    tmp_path: Path,
) -> None:
    from tunepilot.demo.campaign import write_demo_campaign

    path = write_demo_campaign(tmp_path, "extraction", tiny=True, n_conversations=40,
                               overrides=OVERRIDES)  # fmt: skip
    cmd = [sys.executable, "-m", "tunepilot.cli", "plan", str(path), "--gpu", "RTX 4090", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["fits"] is True and out["target"] == "RTX 4090"
    row = next(r for r in out["sheet"]["rows"] if r["card"] == "RTX 4090")
    assert row["memory_bytes"] < 24 * GIB and row["configured"]["verdict"] == "PASS"
    need = row["configured"]["need_by_phase"]
    budget = row["memory_bytes"] * 0.9
    assert need["steady step"] <= budget and need["evaluation"] <= budget  # both phases fit
    # The default eval batch (32) does not fit the card; the one chosen for it does, and
    # every command of the package carries it so the baseline and the variants agree (V2).
    chosen = out["eval_batch"]
    assert 1 <= chosen < 32 and row["eval_batch"] == chosen
    assert f"training.eval_batch_size={chosen}" in out["sentence"]
    commands = [c for phase in out["plan"]["phases"] for c in phase["commands"]]
    runs = [c for c in commands if c.startswith(("tunepilot run", "tunepilot baseline"))]
    assert runs and all(f"training.eval_batch_size={chosen}" in c for c in runs)
    # The chunked loss: the step is not the 22.9 GiB of full fp32 logits any more.
    steady = next(p for p in out["sheet"]["phases"] if p["phase"] == "steady step")
    assert steady["peak"] < 18.5 * GIB
