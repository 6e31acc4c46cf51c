"""The GPU-free dry run (P1, B1, S1, S3, S5): base precision, the meta-tensor
run of every phase, exact block extrapolation, shipped configs, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sizing_support import tiny_llama_campaign
from tunepilot.data.workspace import Workspace
from tunepilot.errors import InputError

torch = pytest.importorskip("torch")

TUNEPILOT = [sys.executable, "-m", "tunepilot.cli"]


@pytest.fixture(scope="module")
def llama_campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny extraction demo: a real 2-block Llama base with weights and tokenizer."""
    return tiny_llama_campaign(tmp_path_factory.mktemp("dry"))


def _ws(path: Path, **overrides: object) -> Workspace:
    return Workspace.open(path, [f"{k}={v}" for k, v in overrides.items()])


# --------------------------------------------------------------------------------------------
# base precision (P1, B1)
# --------------------------------------------------------------------------------------------


def test_p1_bf16_base_keeps_lora_and_saved_modules_fp32_and_records_it(tiny_llama_dir) -> None:
    from tunepilot.campaign import LoraSettings, ModelSettings
    from tunepilot.model.base import resolve_source
    from tunepilot.model.build import apply_method, load_model
    from tunepilot.model.params import trainable_report

    settings = ModelSettings(name_or_path=str(tiny_llama_dir), base_dtype="bf16",
                             lora=LoraSettings(modules_to_save=["lm_head"]))  # fmt: skip
    loaded = load_model(resolve_source(settings), "causal_lm", settings)
    assert loaded.base_dtype == "bf16"
    assert any("base weights in bf16" in n for n in loaded.notes)
    model = apply_method(loaded, settings)
    dtypes = {(p.requires_grad, p.dtype) for p in model.parameters()}
    assert dtypes == {(False, torch.bfloat16), (True, torch.float32)}
    rows = trainable_report(model).rows
    assert {r.dtype for r in rows if r.trainable} == {"float32"}
    assert {r.dtype for r in rows if not r.trainable} == {"bfloat16"}


@pytest.mark.parametrize(
    ("kind", "saved"), [("classification", ["pooler", "classifier"]), ("causal_lm", ["lm_head"])]
)
def test_p1_fp32_saved_modules_train_inside_a_bf16_base_without_autocast(
    tiny_bert_dir, tiny_llama_dir, kind, saved
) -> None:
    """training.precision fp32 (the default) over a bf16 base: the fp32 head takes the base's
    bf16 activations and hands its output back in bf16, so forward, loss and backward run and
    the head's gradient arrives in fp32 (a run used to stop on 'mat1 and mat2 must have the
    same dtype' at its first update)."""
    from tunepilot.campaign import LoraSettings, ModelSettings
    from tunepilot.model.base import resolve_source
    from tunepilot.model.build import apply_method, load_model
    from tunepilot.train.batching import summed_loss

    folder = tiny_bert_dir if kind == "classification" else tiny_llama_dir
    targets = ["query", "value"] if kind == "classification" else ["q_proj", "v_proj"]
    settings = ModelSettings(name_or_path=str(folder), base_dtype="bf16",
                             lora=LoraSettings(target_modules=targets,
                                               modules_to_save=saved))  # fmt: skip
    loaded = load_model(resolve_source(settings), kind, settings, label_names=["a", "b", "c"])
    model = apply_method(loaded, settings)
    assert any("take their inputs in fp32" in n for n in loaded.notes), loaded.notes
    ids = torch.randint(3, 60, (2, 12))
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    labels = torch.tensor([0, 2]) if kind == "classification" else ids
    summed_loss(logits, labels, kind).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert grads and all(g is not None and g.dtype == torch.float32 for g in grads.values())
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_p1_b1_a_quantized_base_on_cpu_is_refused_before_a_run_id_is_reserved(
    llama_campaign: Path,
) -> None:
    """`run` with model.base_dtype nf4 on this CPU is bad input naming the key, and leaves no
    attempt in the ledger (a row there would only send a retry into the same refusal)."""
    from tunepilot.experiments import flow
    from tunepilot.ledger import Ledger

    ws = _ws(llama_campaign, **{"model.base_dtype": "nf4"})
    with pytest.raises(InputError) as info:
        flow.run(ws, ["control"], "0", None, as_json=False)
    assert info.value.problems[0].where == "model.base_dtype"
    with Ledger.open(ws.ledger_path) as ledger:
        assert ledger.list_runs() == []


def test_p1_unset_base_dtype_resolves_to_fp32_on_cpu(tiny_llama_dir) -> None:
    from tunepilot.campaign import ModelSettings
    from tunepilot.model.base import resolve_source
    from tunepilot.model.build import load_model

    settings = ModelSettings(name_or_path=str(tiny_llama_dir))
    loaded = load_model(resolve_source(settings), "causal_lm", settings, device_type="cpu")
    assert loaded.base_dtype == "fp32"
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}


@pytest.mark.parametrize("dtype", ["nf4", "int8"])
def test_p1_b1_quantized_base_on_cpu_is_input_error_pointing_at_size(tiny_llama_dir, dtype) -> None:
    from tunepilot.campaign import ModelSettings
    from tunepilot.model.base import resolve_source
    from tunepilot.model.build import load_model

    settings = ModelSettings(name_or_path=str(tiny_llama_dir), base_dtype=dtype)
    with pytest.raises(InputError) as err:
        load_model(resolve_source(settings), "causal_lm", settings, device_type="cpu")
    problem = err.value.problems[0]
    assert problem.where == "model.base_dtype"
    assert "needs a CUDA GPU" in problem.found and "tunepilot size" in problem.fix


# --------------------------------------------------------------------------------------------
# the dry run (S1, S5)
# --------------------------------------------------------------------------------------------


def test_s1_s5_dry_run_builds_the_run_model_and_splits_each_phase_peak(llama_campaign) -> None:
    from tunepilot.model.build import apply_method, load_model
    from tunepilot.sizing.dry_run.run import PHASES, dry_run

    ws = _ws(llama_campaign)
    result = dry_run(ws, base_dtype="fp32")
    assert [p.phase for p in result.phases] == list(PHASES)
    for p in result.phases:
        parts = p.weights + p.gradients + p.optimizer + p.activations + p.temporaries
        assert p.peak == parts
    # the meta model is the run's model: same trainable and total counts as a real load
    real = apply_method(load_model(ws.model_source, "causal_lm", ws.campaign.model,
                                   device_type="cpu"), ws.campaign.model)  # fmt: skip
    assert result.trainable_params == sum(p.numel() for p in real.parameters() if p.requires_grad)
    assert result.total_params == sum(p.numel() for p in real.parameters())
    steady = result.phase("steady step")
    # AdamW keeps exp_avg and exp_avg_sq in fp32 per trainable parameter (+ a step counter each)
    assert 8 * result.trainable_params <= steady.optimizer <= 8 * result.trainable_params + 4096
    assert result.phase("first step").activations > 0
    assert result.phase("first step").flops > 0
    assert result.phase("checkpoint").activations == 0
    # no length asked for: the longest training example with the campaign's own tokenizer
    prepared = ws.prepare(write=False, seal=False)
    encoder = ws.encoder(prepared.label_names)
    longest = max(len(encoder.encode(e).input_ids) for e in prepared.splits["train"])
    assert result.phase("first step").inputs["length"] == longest <= 64


def test_s1_two_and_three_blocks_extrapolate_to_four(llama_campaign, tmp_path) -> None:
    from tunepilot.sizing.dry_run.config import architecture_config
    from tunepilot.sizing.dry_run.measure import measure_blocks
    from tunepilot.sizing.dry_run.run import PHASES, _combine, dry_run
    from tunepilot.sizing.dry_run.shape import Shape

    config = json.loads((llama_campaign.parent / "base-model" / "config.json").read_text())
    folder = tmp_path / "four-blocks"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 4}))
    ws = _ws(llama_campaign, **{"model.name_or_path": str(folder)})
    predicted = dry_run(ws, base_dtype="fp32", activation_checkpointing=True)
    assert predicted.layers == 4 and predicted.blocks_measured == (2, 3)
    arch = architecture_config(ws.campaign.model, ws.root)
    shape = Shape.from_campaign(ws, arch, microbatch=None, max_length=None,
                                activation_checkpointing=True, base_dtype="fp32",
                                attention=None, device="cuda")  # fmt: skip
    direct = measure_blocks(arch, shape, 4)
    for name in PHASES:
        got, want = predicted.phase(name), _combine(direct.phases, direct.phases, name, 0)
        # what every block holds repeats exactly
        assert (got.weights, got.gradients, got.optimizer, got.flops) == (
            want.weights, want.gradients, want.optimizer, want.flops)  # fmt: skip
        # the peak moment inside a block's backward may shift by a few tensors with depth
        assert got.peak == pytest.approx(want.peak, rel=0.01)
        assert got.activations == pytest.approx(want.activations, rel=0.01)


def test_s1_attention_sized_per_backend_eager_keeps_the_l_by_l_matrix(llama_campaign) -> None:
    from tunepilot.sizing.dry_run.run import dry_run

    ws = _ws(llama_campaign)
    fused = dry_run(ws, base_dtype="fp32", max_length=256, attention="sdpa")
    eager = dry_run(ws, base_dtype="fp32", max_length=256, attention="eager")
    heads, batch = 4, ws.campaign.training.microbatch
    scores = batch * heads * 256 * 256 * 4  # one fp32 B x H x L x L matrix
    # eager holds at least one B x H x L x L matrix at the step's peak; fused SDPA none
    assert eager.phase("first step").peak - fused.phase("first step").peak >= scores
    assert any("no L x L matrix" in n for n in fused.notes)
    assert any("L x L" in n and "eager" in n for n in eager.notes)


# --------------------------------------------------------------------------------------------
# shipped configs (S1)
# --------------------------------------------------------------------------------------------

PUBLISHED_PARAMS = {  # total parameters of each base as its model card states them
    "llama-3-8b-config": 8_030_261_248,
    "llama-3-70b-config": 70_553_706_496,
    "qwen2.5-7b-config": 7_615_616_512,
    "mistral-7b-config": 7_248_023_552,
    "gemma-2-9b-config": 9_241_705_984,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_s1_shipped_config_has_source_and_builds_the_published_size(name, tmp_path) -> None:
    from tunepilot.campaign import ModelSettings
    from tunepilot.model.base import ModelSource
    from tunepilot.model.build import build_from_config
    from tunepilot.sizing.dry_run.config import architecture_config, shipped_configs

    assert name in shipped_configs()
    arch = architecture_config(ModelSettings(name_or_path=name), tmp_path)
    assert "huggingface" in arch.source.lower() or "hub" in arch.source
    counts = []
    for blocks in (1, 2):
        source = ModelSource(arch.path, name, None, None, {}, "local")
        loaded = build_from_config(arch.with_layers(blocks), source, "causal_lm",
                                   ModelSettings(name_or_path=name), base_dtype="bf16")  # fmt: skip
        counts.append(sum(p.numel() for p in loaded.model.parameters()))
    assert counts[0] + (arch.layers - 1) * (counts[1] - counts[0]) == PUBLISHED_PARAMS[name]


def test_s1_l1_size_json_shipped_8b_config_without_download(llama_campaign) -> None:
    done = _size(str(llama_campaign), "model.name_or_path=llama-3-8b-config", "data.max_length=32",
                 "training.eval_batch_size=1", "--gpu", "H100 80GB", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)  # stdout is exactly one JSON document
    result = payload["dry_run"]
    assert result["layers"] == 32 and result["architecture"] == "LlamaForCausalLM"
    frozen = result["total_params"] - result["trainable_params"]
    assert frozen == PUBLISHED_PARAMS["llama-3-8b-config"]
    checkpoint = next(p for p in result["phases"] if p["phase"] == "checkpoint")
    assert checkpoint["weights"] == pytest.approx(2 * frozen, rel=0.01)  # a bf16 base
    # The shipped config has no tokenizer: the campaign's own measures the data, said so.
    assert any("the campaign's own tokenizer" in n and "PROXY" in n for n in result["notes"])
    assert payload["fits"][0]["gpu"] == "H100 80GB" and payload["fits"][0]["verdict"] == "PASS"
    assert payload["fits"][0]["phase"] in {p["phase"] for p in result["phases"]}


# --------------------------------------------------------------------------------------------
# bad input exits 2 naming the file and the fix
# --------------------------------------------------------------------------------------------


def _size(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "500"}  # one problem per line, unwrapped
    return subprocess.run([*TUNEPILOT, "size", *args], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip


def test_s1_size_bad_config_unknown_architecture_and_card_exit_2(llama_campaign, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama",\n "hidden_size": }')
    done = _size(str(llama_campaign), f"model.name_or_path={broken}")
    assert done.returncode == 2, done.stderr
    assert "config.json:2" in done.stderr and "not valid JSON" in done.stderr

    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text('{"model_type": "llamma", "num_hidden_layers": 2}')
    done = _size(str(llama_campaign), f"model.name_or_path={unknown}")
    assert done.returncode == 2, done.stderr
    assert "llamma" in done.stderr and "not known to transformers" in done.stderr

    done = _size(str(llama_campaign), "--gpu", "H1000 80GB")
    assert done.returncode == 2, done.stderr
    assert "H1000 80GB" in done.stderr and "H100 80GB" in done.stderr
    assert "Traceback" not in done.stderr


def test_b1_pilot_extension_gate_refuses_bitsandbytes_off_cuda() -> None:
    from tunepilot.model.base_dtype import exercise_bitsandbytes

    ran, sentence = exercise_bitsandbytes("nf4", torch.device("cpu"))
    assert not ran
    assert "CUDA" in sentence and "tunepilot size" in sentence


# --------------------------------------------------------------------------------------------
# the prediction against the same step executed on real tensors (S1)
# --------------------------------------------------------------------------------------------


def test_s1_tiny_llama_prediction_within_5pct_of_measured_tensor_bytes(llama_campaign) -> None:
    from tunepilot.sizing.dry_run.check import check_steps

    checks = check_steps(_ws(llama_campaign), microbatch=4, max_length=128,
                         activation_checkpointing=True, device="cpu")  # fmt: skip
    assert [c.phase for c in checks] == ["first step", "steady step"]
    for c in checks:
        assert c.measured is not None and c.measured > 1024**2
        assert abs(c.predicted - c.measured) <= 0.05 * c.measured, c.sentence
        assert c.verdict == "PASS"


def test_s1_step_too_small_to_see_activations_cannot_validate_never_pass(llama_campaign):
    from tunepilot.sizing.dry_run.check import CANNOT_VALIDATE, check_steps

    checks = check_steps(_ws(llama_campaign), microbatch=1, max_length=8, device="cpu")
    assert {c.verdict for c in checks} == {CANNOT_VALIDATE}
    assert all(c.error is None and "too little" in c.sentence for c in checks)
