"""`tunepilot plan` on real campaigns pointed at shipped configs, without a GPU and without a
pilot (L1, L3, B4): the banking77 campaign on Llama-3-8B gets a per-card sheet and a 3/7/30-day
package whose memory numbers are the dry run's and whose hours come from FLOPs and the
calibrated utilisation; a 70B LoRA campaign plans on 8x A100 80GB with FSDP at about the
machine's published rate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LLAMA_8B = ["model.name_or_path=llama-3-8b-config", "model.lora.target_modules=[q_proj,v_proj]",
            "model.lora.modules_to_save=[score]"]  # fmt: skip


def banking77(tmp_path: Path, shared_data: Path) -> Path:
    """The example campaign in a scratch folder, its data paths pointed at the shared data."""
    text = (REPO / "examples" / "banking77" / "campaign.yaml").read_text(encoding="utf-8")
    path = tmp_path / "campaign.yaml"
    path.write_text(text.replace("../../../shared/data", str(shared_data)), encoding="utf-8")
    return path


@pytest.mark.slow  # seven dry runs of an 8B step (2 and 3 blocks each): ~30 s quiet, 90 s loaded
def test_l1_l3_plan_on_banking77_with_the_llama_3_8b_config_without_a_gpu(
    tmp_path: Path, shared_data: Path
) -> None:
    from tunepilot.data.workspace import Workspace
    from tunepilot.sizing.catalog import load_catalog
    from tunepilot.sizing.dry_run.run import dry_run

    path = banking77(tmp_path, shared_data)
    cmd = [sys.executable, "-m", "tunepilot.cli", "plan", str(path), *LLAMA_8B]
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    sheet = out["sheet"]
    assert sheet["model"] == "llama-3-8b-config" and sheet["layers"] == 32
    assert [r["card"] for r in sheet["rows"]] == [c.name for c in load_catalog().cards]
    # The memory numbers are the dry run's: the same step sized here gives the same phases.
    ws = Workspace.open(path, LLAMA_8B)
    direct = dry_run(ws, base_dtype="bf16")
    assert [p["peak"] for p in sheet["phases"]] == [p.peak for p in direct.phases]
    h100 = next(r for r in sheet["rows"] if r["card"] == "H100 80GB")
    assert h100["configured"]["peak_bytes"] == direct.peak().peak + direct.cuda_context_bytes
    # Hours from FLOPs and a labelled assumption, a package out of 3/7/30 days.
    assert h100["package"]["days"] in (3, 7, 30) and not h100["package"]["measured"]
    assert "calibrated on three published" in sheet["hours_basis"]
    assert out["plan"]["measured"] is False and out["plan"]["basis"].startswith("computed")
    assert out["pilot_id"] is None and "no pilot has run" in out["pilot_note"]
    # By hand: a bf16 base of 7.5e9 frozen parameters is ~14 GiB; AdamW keeps two fp32 moments
    # of every trained weight; the base's matmuls run in bf16 (training.precision fp32 casts
    # nothing), so hours use the bf16 peak, and the fp32 LoRA share is tiny.
    steady = next(p for p in sheet["phases"] if p["phase"] == "steady step")
    assert 2 * 7.5e9 <= steady["weights"] <= 2 * 7.52e9 + 4 * direct.trainable_params
    assert steady["optimizer"] == pytest.approx(8 * direct.trainable_params, rel=0.01)  # + steps
    assert steady["flops_by"]["bf16"] > 100 * steady["flops_by"]["fp32"]
    assert "989.4 TFLOPS bf16" in h100["basis"] and "NOT scaled" not in json.dumps(out)


@pytest.mark.slow  # nine dry runs of a 70B step: ~40 s quiet
def test_b4_l3_a_70b_lora_campaign_plans_on_8x_a100_with_fsdp_near_the_published_rate(
    tmp_path: Path,
) -> None:
    """torchtune's Llama-3.1-70B LoRA (r16 on q, k, v, 2 x 2048 packed, checkpointing) ran at
    3,497 tokens/s on 8 A100 80GB with FSDP. The plan must run it the same way (one GPU holds
    no replica, so neither side by side nor DDP fits) and time it near that rate."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.demo.campaign import write_demo_campaign
    from tunepilot.pilot.plan import build_plan

    path = write_demo_campaign(tmp_path, "extraction", tiny=True, n_conversations=40, overrides={
        "model.name_or_path": "llama-3-70b-config", "model.method": "lora",
        "model.base_dtype": "bf16", "model.lora.r": 16, "model.lora.alpha": 32,
        "model.lora.target_modules": ["q_proj", "k_proj", "v_proj"],
        "model.lora.modules_to_save": [], "training.precision": "bf16",
        "training.microbatch": 2, "training.accumulation": 8, "data.max_length": 2048,
        "training.activation_checkpointing": True, "training.eval_batch_size": 2})  # fmt: skip
    out, lines = build_plan(Workspace.open(path), gpu="8x A100 80GB", catalog=None, pilot=None)
    row = next(r for r in out["sheet"]["rows"] if r["card"] == "8x A100 80GB")
    layouts = {x["layout_kind"]: x["verdict"] for x in row["layouts"]}
    assert layouts["fsdp"] == "PASS" and layouts["side by side"] == layouts["ddp"] == "FAIL"
    assert out["fits"] and row["configured"]["layout_kind"] == "fsdp"
    plan = out["plan"]
    assert "FSDP over 8" in plan["layout"] and "training.accumulation=1 per GPU" in plan["layout"]
    # No tokenizer measured the data: every example at 2048 tokens, as packed data is.
    tokens_per_update = 2 * 2048 * 8
    rate = tokens_per_update / plan["workload"]["seconds_per_update"]
    assert 0.8 <= rate / 3497 <= 1.25, rate
    assert plan["phases"][0]["name"] == "re-pilot on this card"
    assert any("--nproc 8 --strategy fsdp" in c for p in plan["phases"] for c in p["commands"])
    assert "upper bound" in out["sentence"]
