"""S2, S3, V3, V4, V5: the loop's determinism, stop causes, metrics files and precision options."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from campaign_support import tiny_lm_examples
from tunepilot.campaign import TrainingSettings
from tunepilot.errors import InputError
from tunepilot.tasks.base import Encoded
from tunepilot.train.schedule import lr_at

torch = pytest.importorskip("torch")
from tunepilot.train.loop import train  # noqa: E402  (after the torch skip)

FIELDS = {"update", "loss", "lr", "grad_norm", "loss_tokens", "examples_seen", "seconds", "epoch"}


@pytest.fixture(scope="module")
def data(tiny_llama_dir: Path) -> tuple[list[Encoded], int]:
    """24 causal-LM examples of different lengths, the first tokens of each masked."""
    return tiny_lm_examples(tiny_llama_dir, 24, lambda i: 6 + (i * 5) % 40, lambda i: 3)


def lora_llama(path: Path, dropout: float = 0.1):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(path))
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout,
                        target_modules=["q_proj", "v_proj"])  # fmt: skip
    return get_peft_model(base, config)


def settings(**kw) -> TrainingSettings:
    base = {"microbatch": 2, "accumulation": 3, "budget": {"updates": 6}, "lr": 5e-3}
    return TrainingSettings(**(base | kw))


def run(tiny_llama_dir, data, run_dir, s, model=None, **kw):
    model = model if model is not None else lora_llama(tiny_llama_dir)
    examples, pad = data
    result = train(model, examples, s, run_dir, kind="causal_lm", pad_id=pad, progress=False, **kw)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return result, lines, model


def test_s2_same_seed_gives_bit_identical_losses_and_another_seed_does_not(
    tiny_llama_dir, data, tmp_path
) -> None:
    _, a, _ = run(tiny_llama_dir, data, tmp_path / "a", settings(seed=1))
    _, b, _ = run(tiny_llama_dir, data, tmp_path / "b", settings(seed=1))
    _, c, _ = run(tiny_llama_dir, data, tmp_path / "c", settings(seed=2))
    assert [x["loss"] for x in a] == [x["loss"] for x in b]  # exact, not approximate
    assert [x["loss"] for x in a] != [x["loss"] for x in c]
    assert not torch.are_deterministic_algorithms_enabled()  # restored after the run


def test_v5_metrics_jsonl_has_one_line_per_update_with_every_field(
    tiny_llama_dir, data, tmp_path
) -> None:
    s = settings(scheduler="cosine", warmup_updates=2)
    result, lines, _ = run(tiny_llama_dir, data, tmp_path, s)
    assert result.status == "completed" and result.updates == 6
    assert [x["update"] for x in lines] == [1, 2, 3, 4, 5, 6]
    assert all(x.keys() >= FIELDS for x in lines)
    assert [x["lr"] for x in lines] == [lr_at(u, s, 6) for u in range(6)]
    assert lines[0]["lr"] == pytest.approx(2.5e-3) and lines[1]["lr"] == pytest.approx(5e-3)
    assert [x["examples_seen"] for x in lines] == [6, 12, 18, 24, 30, 36]
    assert lines[3]["epoch"] == pytest.approx(1.0)
    assert all(x["loss_tokens"] > 6 for x in lines)
    assert result.last_loss == lines[-1]["loss"]
    assert result.last_checkpoint == tmp_path / "checkpoints" / "step-000006"


def test_v5_evaluation_points_are_written_and_do_not_move_the_training_curve(
    tiny_llama_dir, data, tmp_path
) -> None:
    calls = []

    def evaluate(model) -> dict:
        calls.append(model.training)
        random.random(), torch.rand(3)  # an evaluation that draws random numbers
        return {"accuracy": 0.5}

    _, plain, _ = run(tiny_llama_dir, data, tmp_path / "plain", settings())
    _, evaluated, model = run(
        tiny_llama_dir, data, tmp_path / "eval", settings(eval_every=4), evaluate=evaluate
    )
    assert [x["loss"] for x in plain] == [x["loss"] for x in evaluated]
    evals = [json.loads(x) for x in (tmp_path / "eval" / "evals.jsonl").read_text().splitlines()]
    assert [e["update"] for e in evals] == [4, 6]  # every 4, and the run's last point
    assert evals[0]["eval"] == {"accuracy": 0.5}
    assert calls == [False, False] and model.training  # eval mode inside, training after


def test_v3_a_huge_lr_diverges_and_keeps_its_line(tiny_llama_dir, data, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    # A full fine-tune: with LoRA on q/v the norms saturate and even lr 1e30 stays finite.
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir))
    # No scheduled checkpoint either: what is checked is that divergence itself saves none.
    s = settings(max_grad_norm=None, checkpoint_every=1000).model_copy(update={"lr": 1e10})
    result, lines, _ = run(tiny_llama_dir, data, tmp_path, s, model=model)
    assert result.status == "diverged" and result.updates >= 1
    assert "not applied" in result.reason
    assert len(lines) == result.updates + 1
    last = lines[-1]
    assert last["stopped"] == "diverged" and last["loss"] is None
    assert last["loss_text"] in ("nan", "inf")
    assert not (tmp_path / "checkpoints").exists()  # nothing saved from a diverged run


def test_v4_loss_bound_stops_before_applying_the_update(tiny_llama_dir, data, tmp_path) -> None:
    model = lora_llama(tiny_llama_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    result, lines, _ = run(tiny_llama_dir, data, tmp_path, settings(stop={"max_loss": 1.0}),
                           model=model)  # fmt: skip
    assert result.status == "stopped_loss_bound" and result.updates == 0
    assert lines[0]["stopped"] == "stopped_loss_bound" and lines[0]["loss"] > 1.0
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(before[name], p.detach()), name


def test_v4_wall_clock_stop_leaves_a_checkpoint_to_resume(tiny_llama_dir, data, tmp_path) -> None:
    result, lines, _ = run(
        tiny_llama_dir, data, tmp_path, settings(stop={"wall_clock_minutes": 1e-9})
    )
    assert result.status == "stopped_wall_clock" and result.updates == 1 and len(lines) == 1
    assert result.last_checkpoint == tmp_path / "checkpoints" / "step-000001"


def test_v3_a_run_folder_with_metrics_is_never_silently_reused(
    tiny_llama_dir, data, tmp_path
) -> None:
    run(tiny_llama_dir, data, tmp_path, settings(budget={"updates": 1}))
    with pytest.raises(InputError, match="already holds metrics"):
        run(tiny_llama_dir, data, tmp_path, settings(budget={"updates": 1}))


def test_s3_fp16_on_cpu_is_an_input_error_with_the_fix(tiny_llama_dir, data, tmp_path) -> None:
    with pytest.raises(InputError) as err:
        run(tiny_llama_dir, data, tmp_path, settings(precision="fp16"))
    problem = err.value.problems[0]
    assert problem.where == "training.precision" and "bf16" in problem.fix


def test_s3_bf16_autocast_runs_on_cpu_close_to_fp32(tiny_llama_dir, data, tmp_path) -> None:
    _, fp32, _ = run(tiny_llama_dir, data, tmp_path / "fp32", settings(budget={"updates": 2}))
    result, bf16, _ = run(tiny_llama_dir, data, tmp_path / "bf16",
                          settings(budget={"updates": 2}, precision="bf16"))  # fmt: skip
    assert result.status == "completed"
    assert all(math.isfinite(x["loss"]) for x in bf16)
    assert bf16[0]["loss"] != fp32[0]["loss"]  # autocast really ran in bf16
    assert bf16[0]["loss"] == pytest.approx(fp32[0]["loss"], abs=0.05)


def test_s3_activation_checkpointing_gives_the_same_losses(tiny_llama_dir, data, tmp_path) -> None:
    model = lora_llama(tiny_llama_dir, dropout=0.0)
    _, plain, _ = run(tiny_llama_dir, data, tmp_path / "plain", settings(),
                      model=lora_llama(tiny_llama_dir, dropout=0.0))  # fmt: skip
    _, checkpointed, _ = run(tiny_llama_dir, data, tmp_path / "ac",
                             settings(activation_checkpointing=True), model=model)  # fmt: skip
    assert model.get_base_model().is_activation_checkpointing
    # Recomputation reorders no arithmetic that matters: the whole curve, not only update 1.
    for a, b in zip(plain, checkpointed, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)


def test_s7_an_epoch_budget_sets_the_number_of_updates(tiny_llama_dir, data, tmp_path) -> None:
    result, lines, _ = run(tiny_llama_dir, data, tmp_path, settings(budget={"epochs": 1.5}))
    assert result.plan is not None and result.plan.updates_per_epoch == 4
    assert result.updates == 6 and lines[-1]["examples_seen"] == 36
    assert len(result.update_seconds) == 6


DISTRIBUTED_CHILD = r"""
import json, os, sys
from pathlib import Path
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM
from tunepilot.campaign import TrainingSettings
from tunepilot.tasks.base import Encoded
from tunepilot.train.loop import train

spec = json.loads(Path(sys.argv[1]).read_text())
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(spec["model_dir"]).double()
if spec["mode"] == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(model)
data = [Encoded(**e) for e in json.loads(Path(spec["data"]).read_text())]
result = train(model, data, TrainingSettings(**spec["settings"]), Path(spec["run_dir"]),
               kind="causal_lm", pad_id=spec["pad_id"], rank=rank, world_size=world,
               progress=False)
assert result.status == "completed", result
dist.barrier()  # before destroy: avoids the rare SIGABRT at exit seen with gloo (ENV.md)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "ddp"])
def test_b3_two_gloo_replicas_x_accumulation_3_match_one_process_x_6(
    tiny_llama_dir, data, tmp_path, mode
) -> None:
    """13 examples, 12 per update: every other update is a single example, so rank 1 has
    no share and must still join the gradient all-reduce (a zero-weight pass under DDP)."""
    import subprocess
    import sys
    from dataclasses import asdict

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    examples, pad = data[0][:13], data[1]
    common = {"microbatch": 2, "budget": {"updates": 4}, "lr": 1e-3, "bucket_by_length": False}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir)).double()
    reference = tmp_path / "one"
    train(model, examples, TrainingSettings(**common, accumulation=6), reference,
          kind="causal_lm", pad_id=pad, progress=False)  # fmt: skip

    (tmp_path / "data.json").write_text(json.dumps([asdict(e) for e in examples]))
    (tmp_path / "child.py").write_text(DISTRIBUTED_CHILD)
    spec = {"model_dir": str(tiny_llama_dir), "data": str(tmp_path / "data.json"),
            "pad_id": pad, "mode": mode, "run_dir": str(tmp_path / "two"),
            "settings": common | {"accumulation": 3}}  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(tmp_path / "child.py"),
        str(tmp_path / "spec.json"),
    ]
    done = subprocess.run(launcher, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    def losses(run_dir: Path) -> list[float]:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x)["loss"] for x in lines]

    assert [
        json.loads(x)["examples"]
        for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()
    ] == [12, 1, 12, 1]
    assert losses(tmp_path / "two") == pytest.approx(losses(reference), rel=1e-9)
    mine = load_file(str(tmp_path / "two" / "checkpoints" / "step-000004" / "model.safetensors"))
    theirs = load_file(str(reference / "checkpoints" / "step-000004" / "model.safetensors"))
    for key in theirs:
        torch.testing.assert_close(mine[key], theirs[key], rtol=1e-6, atol=1e-6, msg=key)


def test_r1_the_lr_is_a_pure_function_of_the_update_index() -> None:
    from tunepilot.train.schedule import lr_factor

    assert [lr_factor(u, "constant", 2, 10) for u in range(4)] == [0.5, 1.0, 1.0, 1.0]
    linear = [lr_factor(u, "linear", 0, 4) for u in range(4)]
    assert linear == [1.0, 0.75, 0.5, 0.25]  # the last update still moves
    assert lr_factor(2, "cosine", 0, 4) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown scheduler"):
        lr_factor(0, "step", 0, 4)
