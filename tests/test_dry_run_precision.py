"""Precision (S3, P1, B1): the precision option sized by its own dry run, autocast's casts
replayed on meta tensors, and hours from the precision each operator really computed in."""

from __future__ import annotations

from pathlib import Path

import pytest

from sizing_support import tiny_llama_campaign
from tunepilot.data.workspace import Workspace

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def llama_campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama_campaign(tmp_path_factory.mktemp("precision"))


@pytest.mark.parametrize("checkpointing", [False, True])
def test_s3_bf16_autocast_over_an_fp32_base_predicted_within_5pct_of_real_autocast(
    llama_campaign: Path, checkpointing: bool
) -> None:
    """The dry run replays torch.autocast's casts (the half copies backward keeps), also when
    activation checkpointing recomputes a block; the real step runs under torch.autocast on
    this CPU. Without the replay the prediction is the fp32 step's, more than 5% off."""
    from tunepilot.sizing.dry_run.check import check_steps

    shape = {"microbatch": 4, "max_length": 128, "activation_checkpointing": checkpointing,
             "base_dtype": "fp32", "device": "cpu"}  # fmt: skip
    mixed = check_steps(Workspace.open(llama_campaign, ["training.precision=bf16"]), **shape)
    plain = check_steps(Workspace.open(llama_campaign, ["training.precision=fp32"]), **shape)
    for bf16, fp32 in zip(mixed, plain, strict=True):
        assert bf16.verdict == "PASS", bf16.sentence
        assert bf16.measured and abs(bf16.error) <= 0.05
        # the precision changes what the step holds by more than the tolerance: a dry run that
        # ignored autocast would fail this check
        assert abs(fp32.predicted - bf16.measured) > 0.05 * bf16.measured


def test_s3_meta_autocast_casts_matmul_inputs_and_caches_trained_weights() -> None:
    from tunepilot.sizing.dry_run.autocast import MetaAutocast

    frozen = torch.nn.Linear(8, 8, device="meta").requires_grad_(False)
    lora = torch.nn.Linear(8, 8, bias=False, device="meta")
    x = torch.randn(2, 8, device="meta", requires_grad=True) * 2  # an activation, not a leaf
    with MetaAutocast("bf16", "cuda") as mode:
        out = frozen(x) + lora(x) + lora(x)
        assert out.dtype == torch.bfloat16
        # a trained fp32 weight is cast once per region (autocast's cache), a frozen one not
        assert list(mode._cached) == [id(lora.weight)]
        normed = torch.nn.functional.layer_norm(out, (8,))
        assert normed.dtype == torch.float32  # CUDA's fp32 list
        assert out.softmax(-1).dtype == torch.float32  # fp32 output without a dtype
    assert not mode._cached  # dropped when the region ends
    with MetaAutocast("bf16", "cpu"):
        assert torch.nn.functional.layer_norm(out, (8,)).dtype == torch.bfloat16  # not on CPU


def test_s3_l3_bf16_base_with_fp32_training_counts_its_matmuls_in_bf16(
    llama_campaign: Path,
) -> None:
    """training.precision fp32 over a bf16 base: no autocast, but the base's matmuls run in
    bf16 and only the fp32 LoRA weights' in fp32; hours use each precision's own peak."""
    from tunepilot.sizing.catalog import load_catalog
    from tunepilot.sizing.dry_run.run import dry_run
    from tunepilot.sizing.sheet import sheet_inputs, work_of
    from tunepilot.sizing.timing import seconds_on

    ws = Workspace.open(llama_campaign, ["training.precision=fp32"])
    steady = dry_run(ws, base_dtype="bf16").phase("steady step")
    assert set(steady.flops_by) == {"bf16", "fp32"}
    assert steady.flops_by["bf16"] > steady.flops_by["fp32"] > 0
    assert sum(steady.flops_by.values()) == steady.flops
    inputs = sheet_inputs(ws.campaign, 100, 20, "bf16")
    flops, io = work_of(dry_run(ws, base_dtype="bf16"), inputs)
    assert flops.precision == "bf16" and "bf16" in flops.shares()
    catalog = load_catalog()
    card = catalog.card("A100 80GB")
    seconds, basis = seconds_on(card, catalog, flops, io)
    from tunepilot.sizing.throughput import LORA

    mfu = LORA.expected
    expected = flops.update_by["bf16"] / (312e12 * mfu) + flops.update_by["fp32"] / (19.5e12 * mfu)
    assert seconds.update == pytest.approx(expected)
    assert "312 TFLOPS bf16" in basis and "19.5 TFLOPS fp32" in basis


def test_l3_a_card_without_a_precision_the_step_computes_in_gets_no_hours() -> None:
    from tunepilot.sizing.catalog import load_catalog
    from tunepilot.sizing.timing import WorkBytes, seconds_on, work_flops

    catalog = load_catalog()
    flops = work_flops({"bf16": 9e14, "fp32": 1e12}, {"bf16": 1e15})
    assert flops.per_update == 9.01e14 and flops.precision == "bf16"
    seconds, why = seconds_on(catalog.card("T4"), catalog, flops, WorkBytes(1, 1, 1))
    assert seconds is None and "has no bf16" in why


def test_p1_p2_trainable_json_records_the_base_dtype_and_fp32_trained_weights(
    tiny_llama_dir: Path,
) -> None:
    """What a run writes to runs/<id>/trainable.json (and the ledger) names the dtype the base
    was loaded in and the dtype the trained weights kept, not only per row."""
    from tunepilot.campaign import LoraSettings, ModelSettings
    from tunepilot.model.base import resolve_source
    from tunepilot.model.build import apply_method, load_model
    from tunepilot.model.params import trainable_report

    for base, frozen in (("bf16", "bfloat16"), (None, "float32")):  # unset: fp32 on CPU
        settings = ModelSettings(name_or_path=str(tiny_llama_dir), base_dtype=base,
                                 lora=LoraSettings(modules_to_save=["lm_head"]))  # fmt: skip
        model = apply_method(load_model(resolve_source(settings), "causal_lm", settings), settings)
        report = trainable_report(model).to_json()
        assert report["frozen_dtypes"] == [frozen] and report["trainable_dtypes"] == ["float32"]


def test_b1_nf4_on_simulated_cuda_without_bitsandbytes_is_bad_input_not_an_import_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the load gate / a run on a CUDA card says when bitsandbytes is missing (the CUDA
    side is simulated by passing device_type; no GPU here)."""
    import importlib.util

    from tunepilot.errors import InputError
    from tunepilot.model.base_dtype import require_quantization_backend

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "bitsandbytes" else real(n, *a))  # fmt: skip
    with pytest.raises(InputError) as caught:
        require_quantization_backend("nf4", device_type="cuda")
    assert "pip install bitsandbytes" in caught.value.problems[0].fix
    with pytest.raises(InputError, match="needs a CUDA"):
        require_quantization_backend("int8", device_type="cpu")
    require_quantization_backend("bf16", device_type="cpu")  # nothing to refuse
