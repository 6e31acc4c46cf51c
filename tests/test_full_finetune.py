"""P1, S1, S2, S3: full fine-tuning with bf16 trained weights, other optimizers and the step in
backward; what refuses bad combinations; what the dry run sizes for each option.

The tiny Llama trains for real on CPU (torch's optimizers); bitsandbytes' 8-bit optimizers are
CUDA-only, so here they are refused by `run` and sized by the dry run (its stand-in allocates
bitsandbytes' own state layout; the GPU script compares it with bitsandbytes itself).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

TUNEPILOT = [sys.executable, "-m", "tunepilot.cli"]
TINY = {"training.lr": 1e-3, "data.max_length": 256, "training.budget.updates": 3}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TUNEPILOT, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated extraction campaign on the tiny Llama (full fine-tuning)."""
    from tunepilot.demo.campaign import write_demo_campaign

    folder = tmp_path_factory.mktemp("full-ft")
    return write_demo_campaign(folder, "extraction", tiny=True, n_conversations=40, overrides=TINY)


@pytest.mark.parametrize(("overrides", "keys"), [
    (["training.optimizer_in_backward=true"],
     ["training.optimizer_in_backward=true with training.accumulation=8",
      "set training.accumulation=1", "training.max_grad_norm=null"]),
    (["training.weights_dtype=bf16", "training.precision=fp16"],
     ["training.weights_dtype=bf16 with training.precision=fp16", "set training.precision=bf16"]),
])  # fmt: skip
def test_s2_s3_bad_combinations_exit_2_naming_the_key_and_the_fix(campaign, overrides, keys):
    result = cli("validate", str(campaign), *overrides)
    assert result.returncode == 2, result.stderr
    text = " ".join(result.stderr.split())
    for key in keys:
        assert key in text, text


def test_s1_eight_bit_optimizer_on_cpu_run_exits_2_before_a_run_is_recorded(campaign):
    result = cli("run", str(campaign), "training.optimizer=paged_adamw_8bit")
    assert result.returncode == 2, result.stderr[-2000:]
    text = " ".join(result.stderr.split())
    assert "training.optimizer" in text and "set training.optimizer=adamw" in text
    assert "tunepilot size" in text  # sizing still works without a GPU
    assert not (campaign.parent / "runs").exists() or not any((campaign.parent / "runs").iterdir())


def _tiny_data(tiny_llama_dir: Path) -> list:
    from transformers import AutoTokenizer

    from tunepilot.model.tiny import DEFAULT_CORPUS
    from tunepilot.tasks.base import IGNORE_INDEX, Encoded

    tok = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    out = []
    for i in range(8):
        ids = tok(DEFAULT_CORPUS[i % len(DEFAULT_CORPUS)])["input_ids"][:30] + [tok.eos_token_id]
        out.append(Encoded(f"ex{i}", ids, [IGNORE_INDEX] + ids[1:], 1, False, False, len(ids)))
    return out


def _full_model(tiny_llama_dir: Path, weights_dtype: str = "fp32"):
    from transformers import AutoModelForCausalLM

    from tunepilot.model.base_dtype import keep_trainable_in

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir))
    keep_trainable_in(model, weights_dtype)
    return model


def test_s1_optimizer_in_backward_steps_bit_for_bit_as_adamw_after_backward(
    tiny_llama_dir: Path, tmp_path: Path
):
    """Same updates, same weights, same checkpoint files: only when the step runs differs."""
    from safetensors.torch import load_file

    from tunepilot.campaign import TrainingSettings
    from tunepilot.train.checkpoint import load_checkpoint
    from tunepilot.train.in_backward import InBackward
    from tunepilot.train.loop import train

    data = _tiny_data(tiny_llama_dir)
    common = {"microbatch": 4, "accumulation": 1, "budget": {"updates": 3}, "lr": 1e-3,
              "max_grad_norm": None, "seed": 3, "checkpoint_every": 3}  # fmt: skip
    models, curves = {}, {}
    for name, in_backward in (("after", False), ("in", True)):
        models[name] = _full_model(tiny_llama_dir)
        settings = TrainingSettings(**common, optimizer_in_backward=in_backward)
        train(models[name], data, settings, tmp_path / name, kind="causal_lm", pad_id=0,
              progress=False)  # fmt: skip
        curves[name] = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").open()]
    assert [c["loss"] for c in curves["in"]] == [c["loss"] for c in curves["after"]]
    norms = [(a["grad_norm"], b["grad_norm"])
             for a, b in zip(curves["in"], curves["after"], strict=True)]
    assert all(abs(x - y) <= 1e-6 * y for x, y in norms), norms  # summed in hooks vs at once
    pairs = zip(models["in"].named_parameters(), models["after"].named_parameters(), strict=True)
    for (_, p), (_, q) in pairs:
        assert torch.equal(p, q)
    step_in = tmp_path / "in" / "checkpoints" / "step-000003"
    step_after = tmp_path / "after" / "checkpoints" / "step-000003"
    assert sorted(p.name for p in step_in.iterdir()) == sorted(p.name for p in step_after.iterdir())
    a, b = load_file(str(step_in / "optimizer.safetensors")), load_file(
        str(step_after / "optimizer.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the step-in-backward state loads into per-parameter optimizers and into one AdamW alike
    fresh = _full_model(tiny_llama_dir)
    params = [p for p in fresh.parameters() if p.requires_grad]
    load_checkpoint(step_in, fresh, torch.optim.AdamW(params, lr=1e-3))
    again = _full_model(tiny_llama_dir)
    split = InBackward([p for p in again.parameters()], lambda ps: torch.optim.AdamW(ps))
    assert load_checkpoint(step_after, again, split)["update"] == 3


def test_p1_bf16_trained_weights_keep_gradients_and_adamw_state_in_bf16(tiny_llama_dir, tmp_path):
    from tunepilot.campaign import TrainingSettings
    from tunepilot.train.loop import train
    from tunepilot.train.optimizer import build_optimizer

    model = _full_model(tiny_llama_dir, "bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    settings = TrainingSettings(microbatch=4, accumulation=2, budget={"updates": 2}, lr=1e-2,
                                weights_dtype="bf16")  # fmt: skip
    result = train(model, _tiny_data(tiny_llama_dir), settings, tmp_path / "r", kind="causal_lm",
                   pad_id=0, progress=False)  # fmt: skip
    assert result.status == "completed"
    optimizer = build_optimizer(model, settings)
    (model(input_ids=torch.tensor([[1, 2, 3]])).logits.float().sum()).backward()
    assert {p.grad.dtype for p in model.parameters()} == {torch.bfloat16}
    optimizer.step()
    state = {v.dtype for s in optimizer.state.values() for k, v in s.items() if k != "step"}
    assert state == {torch.bfloat16}


def test_s1_adamw_bf16_states_keeps_bf16_moments_and_follows_torch_adamw():
    from tunepilot.train.bf16_moments import AdamWBf16Moments

    torch.manual_seed(0)
    ours, theirs = (torch.nn.Parameter(torch.randn(64, 32)) for _ in range(2))
    with torch.no_grad():
        theirs.copy_(ours)
    a = AdamWBf16Moments([ours], lr=1e-2, weight_decay=0.1)
    b = torch.optim.AdamW([theirs], lr=1e-2, weight_decay=0.1, foreach=False)
    for _ in range(5):
        grad = torch.randn(64, 32)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        a.step()
        b.step()
    assert a.state[ours]["exp_avg"].dtype == torch.bfloat16 == a.state[ours]["exp_avg_sq"].dtype
    moved = (theirs.detach() - ours.detach()).abs().max() / 0.05  # 5 steps of lr 1e-2
    assert float(moved) < 0.05, float(moved)  # bf16 moments: within 5% of a step's size


def test_s3_unset_precision_is_bf16_on_a_cuda_card_with_bf16_and_fp32_elsewhere():
    from tunepilot.train.precision import resolve_precision

    assert resolve_precision(None, "cuda", bf16_supported=True)[0] == "bf16"
    assert resolve_precision(None, "cuda", bf16_supported=False)[0] == "fp32"
    assert resolve_precision(None, "cpu")[0] == "fp32"
    assert resolve_precision("fp16", "cuda", bf16_supported=True)[0] == "fp16"


def test_s3_tf32_follows_training_tf32_while_the_loop_runs_on_a_cuda_device_object():
    """The switches are process flags torch exposes on every build; restored afterwards."""
    from types import SimpleNamespace

    from tunepilot.campaign import TrainingSettings
    from tunepilot.train.runtime import cuda_switches

    before = torch.backends.cuda.matmul.allow_tf32
    cuda = SimpleNamespace(type="cuda")
    for wanted in (True, False):
        with cuda_switches(TrainingSettings(tf32=wanted), cuda):
            assert torch.backends.cuda.matmul.allow_tf32 is wanted
            assert torch.backends.cudnn.allow_tf32 is wanted
        assert torch.backends.cuda.matmul.allow_tf32 is before
    with cuda_switches(TrainingSettings(tf32=False), torch.device("cpu")):
        assert torch.backends.cuda.matmul.allow_tf32 is before  # nothing to switch on CPU


def test_b2_runtime_choices_are_recorded_apart_from_the_backend_fingerprint(tmp_path):
    from tunepilot.campaign import TrainingSettings
    from tunepilot.measure.env import fingerprint
    from tunepilot.pilot.stale import runs_on_other_backends
    from tunepilot.train.runtime import runtime_line, runtime_record

    record = runtime_record(TrainingSettings(optimizer="sgd", weights_dtype="bf16"), "cuda")
    assert record["tf32"] is True and record["host_syncs_per_update"] == 1
    assert "torch SGD" in record["optimizer"] and "bf16 trained weights" in record["optimizer"]
    assert "TF32 on" in runtime_line(record)
    env = fingerprint()
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "env.json").write_text(json.dumps({**env, "runtime": record}))
    assert runs_on_other_backends(tmp_path / "runs", env) == []  # a choice, not a backend


def test_r1_a_prefetched_update_is_not_the_position_a_checkpoint_saves():
    from tunepilot.tasks.base import Encoded
    from tunepilot.train.batching import UpdateSampler
    from tunepilot.train.feed import UpdateFeed

    data = [Encoded(f"e{i}", [1, 2, 3], [1, 2, 3], 0, False, False, 3) for i in range(8)]
    sampler = UpdateSampler([3] * 8, 2, 1, seed=0)
    feed = UpdateFeed(sampler, data, "causal_lm", 0, torch.device("cpu"))
    first = feed.next()
    assert feed.state_dict()["position"] == 1
    feed.prefetch()  # update 2 drawn while update 1 is still being trained
    assert feed.state_dict()["position"] == 1 and sampler.state_dict()["position"] == 2
    assert feed.next().batch.index == first.batch.index + 1
    assert feed.state_dict()["position"] == 2


@pytest.fixture(scope="module")
def sized(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Llama 3 8B full fine-tuning, bf16 weights, 1 x 512, sized three ways on the CUDA path."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.demo.campaign import write_demo_campaign
    from tunepilot.sizing.dry_run.run import dry_run

    path = write_demo_campaign(tmp_path_factory.mktemp("sized"), "extraction", tiny=True,
                               n_conversations=40, overrides={
        "model.name_or_path": "llama-3-8b-config", "model.method": "full",
        "model.base_dtype": "bf16", "training.weights_dtype": "bf16", "training.precision": "fp32",
        "training.microbatch": 1, "data.max_length": 512, "training.accumulation": 1,
        "training.max_grad_norm": None, "training.eval_batch_size": 1,
        "training.activation_checkpointing": True})  # fmt: skip
    ways = {"adamw": [], "adamw_8bit": ["training.optimizer=adamw_8bit"],
            "paged + in backward": ["training.optimizer=paged_adamw_8bit",
                                    "training.optimizer_in_backward=true"]}  # fmt: skip
    return {name: dry_run(Workspace.open(path, over)) for name, over in ways.items()}


@pytest.mark.slow
def test_s1_dry_run_sizes_bf16_weights_and_each_optimizers_state(sized):
    from tunepilot.sizing.dry_run.optimizers import bitsandbytes_state_bytes

    plain, eight = sized["adamw"], sized["adamw_8bit"]
    n = plain.trainable_params
    assert plain.trainable_bytes == 2 * n  # bf16 trained weights
    steady = plain.phase("steady step")
    assert steady.weights == pytest.approx(2 * n, rel=0.01)
    assert steady.optimizer == pytest.approx(4 * n, rel=0.01)  # two bf16 moments (torch AdamW)
    # bitsandbytes: two uint8 moments + fp32 absmax per 256, fp32 moments under 4096 elements
    assert eight.phase("steady step").optimizer == pytest.approx(2.03 * n, rel=0.01)
    assert bitsandbytes_state_bytes(4096 * 256) == 2 * 4096 * 256 + 2 * 4 * 4096
    assert bitsandbytes_state_bytes(100) == 800


@pytest.mark.slow
def test_s1_paged_state_is_apart_from_the_peak_and_the_step_in_backward_frees_gradients(sized):
    plain, paged = sized["adamw"], sized["paged + in backward"]
    first = paged.phase("first step")
    assert first.optimizer == 0 and paged.phase("steady step").optimizer == 0
    assert first.host_paged == pytest.approx(2.03 * paged.trainable_params, rel=0.01)
    # without the step in backward the whole model's bf16 gradients are alive at the step
    assert plain.phase("first step").gradients >= 0.9 * plain.trainable_bytes
    assert first.gradients <= 0.05 * paged.trainable_bytes  # one layer's at most
    assert first.peak < plain.phase("first step").peak - plain.trainable_bytes


def test_b4_fsdp_of_an_nf4_base_is_refused_before_any_process_starts(campaign):
    """What `tunepilot run --nproc N --strategy fsdp` checks before it launches torchrun."""
    from tunepilot.errors import InputError
    from tunepilot.train.sharded_build import check_fsdp

    with pytest.raises(InputError) as refused:
        check_fsdp(campaign.parent / "base-model", "causal_lm", "nf4")
    (problem,) = refused.value.problems
    assert problem.where == "model.base_dtype" and "--strategy ddp" in problem.fix
    check_fsdp(campaign.parent / "base-model", "causal_lm", "bf16")  # Llama names its blocks


def _losses(run_dir: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_b4_fsdp_from_meta_trains_the_single_process_curve_and_writes_its_checkpoint(campaign):
    """2 gloo ranks x accumulation 2, built on meta and filled per rank, against one process x
    accumulation 4: the same losses (float32 summation order apart) and checkpoint files."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tunepilot.train.checkpoint import load_checkpoint

    lora = ["model.method=lora", "model.lora.target_modules=[q_proj,v_proj,o_proj]",
            "training.lr=1e-2"]  # fmt: skip
    sharded = cli("run", str(campaign), "--variant", "control", "--nproc", "2", "--strategy",
                  "fsdp", "training.accumulation=2", *lora)  # fmt: skip
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    single = cli("run", str(campaign), "--variant", "control", "training.accumulation=4", *lora)
    assert single.returncode == 0, single.stderr[-3000:]
    meta, one = (campaign.parent / "runs" / f"control-s0-{n}" for n in (1, 2))
    assert "fsdp" in (meta / "config.resolved.yaml").read_text()
    torch.testing.assert_close(_losses(meta), _losses(one), rtol=1e-5, atol=0)
    a, b = (sorted((r / "checkpoints").iterdir())[-1] for r in (meta, one))
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    base = AutoModelForCausalLM.from_pretrained(str(campaign.parent / "base-model"))
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16,
                                            target_modules=["q_proj", "v_proj", "o_proj"]))
    params = [p for p in model.parameters() if p.requires_grad]
    assert load_checkpoint(a, model, torch.optim.AdamW(params))["plan"]["replicas"] == 2


@pytest.mark.slow
def test_d7_r1_pure_bf16_full_fine_tune_passes_the_overfit_gate_and_resumes_bitwise(campaign):
    """The pilot on the tiny Llama with every weight, gradient and AdamW state in bf16."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.pilot.flow import execute_pilot

    ws = Workspace.open(campaign, ["model.base_dtype=bf16", "training.weights_dtype=bf16"])
    rows = {r.phase: r for r in execute_pilot(ws).rows}
    assert rows["overfit"].verdict == "PASS", rows["overfit"].sentence
    assert rows["resume"].verdict == "PASS", rows["resume"].sentence
    assert "bitwise equal" in rows["resume"].sentence
    assert rows["accumulation"].verdict == "PASS", rows["accumulation"].sentence


def test_b4_fsdp_from_meta_per_rank_is_a_shard_of_the_state_and_two_gathered_blocks():
    from types import SimpleNamespace

    from tunepilot.sizing.dry_run.fsdp import fsdp_rank_bytes

    gib = 2**30
    top = SimpleNamespace(weights=128 * gib, gradients=0, optimizer=2 * gib, peak=138 * gib)
    dry = SimpleNamespace(peak=lambda: top, block_bytes=3 * gib // 2, layers=80)  # 120 GiB
    rank = fsdp_rank_bytes(dry, 8)
    assert rank.sharded_state == 130 * gib // 8
    # two gathered blocks, and the 8 GiB outside the blocks (embeddings, norm, head) gathered
    # whole: 1/8 of it is already in the sharded state
    assert rank.gathered_blocks == 2 * (3 * gib // 2) + 8 * gib - gib
    assert rank.device_peak == 138 * gib - 130 * gib + 130 * gib // 8 + rank.gathered_blocks
    assert rank.host_load == 128 * gib // 8 + 3 * gib // 2  # never a full copy per rank
    assert "FSDP from meta over 8" in rank.sentence()


def test_b4_l1_the_fsdp_verdict_counts_the_unit_outside_the_blocks_gathered_whole():
    """The sheet's FSDP bytes per GPU (the one verdict, `sizing.fit.per_gpu_bytes`): the
    sharded state, one gathered block, and the embeddings, final norm and head, which
    `train.distributed.shard_units` keeps gathered through the step for the chunked loss."""
    from types import SimpleNamespace

    from tunepilot.sizing.fit import FSDP, Layout, per_gpu_bytes

    gib = 2**30
    step = SimpleNamespace(phase="steady step", weights=128 * gib, gradients=0,
                           optimizer=2 * gib, peak=138 * gib)  # fmt: skip
    dry = SimpleNamespace(phases=[step], layers=80, block_bytes=3 * gib // 2)  # outer: 8 GiB
    need = per_gpu_bytes(dry, Layout(FSDP, 8))["steady step"]
    assert need == 138 * gib - 130 * gib + 130 * gib // 8 + 128 * gib // 80 + 7 * gib
    one_depth = SimpleNamespace(phases=[step], layers=80, block_bytes=0)  # no block measured
    assert per_gpu_bytes(one_depth, Layout(FSDP, 8))["steady step"] == need - 7 * gib


def test_s2_a_deferred_update_of_several_microbatches_steps_once_as_adamw_would():
    """The pilot's updates of several microbatches keep the hooks off and step once."""
    from tunepilot.train.in_backward import InBackward

    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    theirs.load_state_dict(ours.state_dict())
    split = InBackward(list(ours.parameters()), lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    whole = torch.optim.AdamW(theirs.parameters(), lr=1e-2, foreach=False)
    x = torch.randn(6, 8)
    with split.deferred():
        for part in (x[:3], x[3:]):
            ours(part).square().sum().backward()
    assert all(p.grad is not None for p in ours.parameters())  # nothing stepped yet
    split.step()
    theirs(x).square().sum().backward()
    whole.step()
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    split.zero_grad()
    assert all(p.grad is None for p in ours.parameters())
