"""Sizing before renting (S1, S7, L1, L2): bytes model, memory model, updates, selection sheet,
and the GPU catalog it reads."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from tunepilot.errors import InputError
from tunepilot.measure.memory import MemoryProbe
from tunepilot.sizing.catalog import GIB, load_catalog, speed_ratio
from tunepilot.sizing.sheet import (
    CHECKPOINTING_KEEPS,
    DEFAULT_OVERHEAD_BYTES,
    MemoryModel,
    fit_memory_model,
    holdout_error,
    measure_memory_grid,
    selection_sheet,
    static_bytes,
    updates_sheet,
)
from tunepilot.verdict import Verdict

# --------------------------------------------------------------------------------------------
# S1: the static bytes of the trainable set
# --------------------------------------------------------------------------------------------


def test_s1_static_bytes_full_fine_tune_adamw_fp32() -> None:
    s = static_bytes(1_000_000, 1_000_000, "fp32", "adamw")
    assert (s.weights, s.gradients, s.optimizer_state, s.master_weights) == (
        4_000_000,
        4_000_000,
        8_000_000,
        0,
    )
    assert s.total == 16_000_000
    assert "adamw state" in s.sentence


def test_s1_static_bytes_lora_counts_gradients_and_state_for_the_trainable_set_only() -> None:
    # MiniLM LoRA (ENV.md): 22.7M parameters, 75,653 trainable.
    s = static_bytes(22_700_000, 75_653, "bf16", "adamw")
    assert s.weights == 22_700_000 * 4  # autocast keeps fp32 weights (tunepilot's loop)
    assert s.gradients == 75_653 * 4
    assert s.optimizer_state == 75_653 * 8
    assert s.master_weights == 0
    half = static_bytes(22_700_000, 75_653, "bf16", "adamw", weights_dtype="bf16")
    assert half.weights == 22_700_000 * 2 and half.gradients == 75_653 * 2
    assert half.master_weights == 75_653 * 4  # fp32 copies of what is trained
    assert "master copies" in half.sentence


def test_s1_static_bytes_reports_every_bad_input_together() -> None:
    with pytest.raises(InputError) as err:
        static_bytes(10, 20, "fp8", "lion")
    where = {p.where for p in err.value.problems}
    assert where == {"training.precision", "training.optimizer", "model"}


# --------------------------------------------------------------------------------------------
# L1: the memory model
# --------------------------------------------------------------------------------------------

GRID = [(mb, n) for mb in (1, 2, 4, 8) for n in (64, 128, 256, 512)]
FIXED, A, B = 900e6, 40_000.0, 60.0


def _synthetic(noise: float, seed: int = 0) -> list[tuple[int, int, float]]:
    rng = random.Random(seed)
    return [
        (mb, n, (FIXED + A * mb * n + B * mb * n * n) * (1 + rng.uniform(-noise, noise)))
        for mb, n in GRID
    ]


def test_l1_memory_model_recovers_known_coefficients_and_predicts_a_held_out_point() -> None:
    points = _synthetic(noise=0.001)
    model = fit_memory_model(points)
    assert model.fixed == pytest.approx(FIXED, rel=0.02)
    assert model.per_token == pytest.approx(A, rel=0.05)
    assert model.per_token_length == pytest.approx(B, rel=0.05)
    assert model.identifiable
    check = holdout_error(points, holdout=(4, 256))
    print(check.sentence)
    assert (check.microbatch, check.length) == (4, 256)
    assert check.relative_error < 0.005
    assert check.verdict is Verdict.PASS
    assert "error" in check.sentence and "4 x length 256" in check.sentence


def test_l1_memory_model_exact_without_noise() -> None:
    model = fit_memory_model(_synthetic(noise=0.0))
    assert model.predict(16, 1024) == pytest.approx(FIXED + A * 16 * 1024 + B * 16 * 1024**2)
    assert model.max_fit_error < 1e-9


def test_l1_memory_model_keeps_every_coefficient_non_negative() -> None:
    # Peaks that bend downwards in length: plain least squares would make b negative.
    points = [(1, 64, 100.0), (1, 128, 180.0), (1, 256, 300.0), (2, 256, 560.0)]
    model = fit_memory_model(points)
    assert min(model.fixed, model.per_token, model.per_token_length) >= 0
    assert model.per_token_length == 0.0


def test_l1_memory_model_says_when_the_grid_cannot_separate_the_terms() -> None:
    points = [(1, 128, 1e9), (2, 128, 1.1e9), (4, 128, 1.3e9)]  # one length only
    model = fit_memory_model(points)
    assert not model.identifiable
    assert "vary length" in model.sentence()


def test_l1_holdout_error_warns_when_the_fit_misses() -> None:
    points = [(1, 64, 1e9), (2, 64, 1.01e9), (1, 128, 1.02e9), (2, 128, 1.03e9), (8, 512, 1.5e9)]
    check = holdout_error(points, holdout=-1)
    assert check.relative_error > 0.10
    assert check.verdict is Verdict.WARN and "more grid points" in check.sentence


@pytest.mark.slow  # ~4 s for the grid plus ~3 s to build the tiny model
def test_l1_memory_model_from_a_real_grid_on_a_tiny_model(tiny_llama_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(microbatch: int, length: int) -> None:
        ids = torch.randint(5, model.config.vocab_size, (microbatch, length))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    grid = [(2, 128), (1, 32), (2, 32), (1, 128), (4, 128)]
    points = measure_memory_grid(step, grid, MemoryProbe.for_device("cpu"))
    assert [(mb, n) for mb, n, _ in points] == [(1, 32), (2, 32), (1, 128), (2, 128), (4, 128)]
    fitted = fit_memory_model(points)
    check = holdout_error(points, holdout=(2, 128))
    print(fitted.sentence(), "|", check.sentence)
    assert all(math.isfinite(v) for v in (fitted.fixed, fitted.per_token, check.predicted))
    assert fitted.fixed > 0 and math.isfinite(check.relative_error)


# --------------------------------------------------------------------------------------------
# S7: the updates arithmetic
# --------------------------------------------------------------------------------------------


def test_s7_seed_example_2_per_microbatch_8_accumulations_1_gpu_gives_16_and_200_updates() -> None:
    sheet = updates_sheet(3200, microbatch=2, accumulation=8, replicas=1, epochs=1)
    assert sheet["examples_per_update"] == 16
    assert sheet["updates_per_epoch"] == 200
    assert sheet["total_updates"] == 200
    assert sheet["examples_seen"] == 3200
    assert sheet["partial_update_examples"] == 0
    assert sheet["held"] == "epochs" and sheet["follows"] == "updates"
    assert "model parallelism does not multiply" in sheet["rule"]


def test_s7_holding_updates_fixed_with_a_bigger_batch_changes_examples_seen() -> None:
    small = updates_sheet(3200, 2, 8, updates=200)
    big = updates_sheet(3200, 2, 8, replicas=2, updates=200)
    assert small["held"] == big["held"] == "updates"
    assert big["follows"] == "epochs and examples seen"
    assert (small["examples_seen"], small["epochs"]) == (3200, 1.0)
    assert (big["examples_per_update"], big["examples_seen"], big["epochs"]) == (32, 6400, 2.0)


# --------------------------------------------------------------------------------------------
# the GPU catalog
# --------------------------------------------------------------------------------------------


def test_l1_shipped_catalog_lists_common_cards_with_prices_to_fill_in() -> None:
    catalog = load_catalog()
    names = {c.name for c in catalog.cards}
    assert {"T4", "L4", "A10", "RTX 4090", "A100 40GB", "A100 80GB", "H100 80GB"} <= names
    assert {"H200 141GB", "MI300X 192GB"} <= names
    assert catalog.card("mi300x 192gb").backend == "rocm"
    assert not catalog.card("T4").bf16
    assert all(set(c.prices) == {3, 7, 30} for c in catalog.cards)
    assert all(p is None for c in catalog.cards for p in c.prices.values())
    assert "assumption" in catalog.speed_basis.lower()
    ratio, estimate = speed_ratio(catalog, "A100 40GB", "H100 80GB")
    assert estimate and ratio == pytest.approx(2.2)
    assert speed_ratio(catalog, "L4", "l4") == (1.0, False)


def test_l1_user_catalog_errors_name_the_key_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "speed_basis: my own measurements\n"
        "cards:\n"
        "  - name: B200\n"
        "    memory_gib: 180\n"
        "    backend: cuda\n"
        "    bf16: true\n"
        "    relative_speed: 4\n"
        "    price: {3: 100}\n"
        "  - name: Weird\n"
        "    memory_gib: -1\n"
        "    backend: metal\n"
        "    bf16: true\n"
        "    relative_speed: 1\n",
        encoding="utf-8",
    )
    with pytest.raises(InputError) as err:
        load_catalog(path)
    found = {(p.where, p.found.split(" (")[0]) for p in err.value.problems}
    assert (f"{path}:8 cards.0.price", "unknown key `price`") in found
    wheres = {p.where for p in err.value.problems}
    assert f"{path}:10 cards.1.memory_gib" in wheres
    assert f"{path}:11 cards.1.backend" in wheres
    with pytest.raises(InputError, match="did you mean `H100 80GB`"):
        load_catalog().card("H100 80G")


def test_l1_user_catalog_with_prices_loads(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "speed_basis: measured\ncards:\n  - {name: X1, memory_gib: 48, backend: rocm, "
        "bf16: true, relative_speed: 1.5, gpus: 4, prices: {3: 300, 7: 600, 30: 2000}}\n",
        encoding="utf-8",
    )
    card = load_catalog(path).card("X1")
    assert card.prices == {3: 300.0, 7: 600.0, 30: 2000.0}
    assert card.memory_bytes == 48 * GIB and card.gpus == 4


# --------------------------------------------------------------------------------------------
# L1, L2: the selection sheet
# --------------------------------------------------------------------------------------------

# A 1B-parameter full fine-tune measured in fp32: 1.5 MB of activations per token and an
# attention term of 2 KB per token per unit of length.
MODEL = MemoryModel(fixed=0.0, per_token=1.5e6, per_token_length=2000.0)
TOTAL = 1_000_000_000


def _sheet(**overrides):
    args = dict(
        n_params_total=TOTAL,
        n_trainable=TOTAL,
        memory_model=MODEL,
        microbatch=8,
        max_length=1024,
        accumulation=2,
        precision="fp32",
        expected_result="macro-F1 on banking77 up by 3 points, no class down by more than 5",
        cards=load_catalog().cards,
        stack_checked=True,
        checked_backend="cuda",
        measured_on="A100 80GB",
    )
    args.update(overrides)
    return selection_sheet(**args)


def _row(sheet, label):
    return next(r for r in sheet["rows"] if r["label"] == label)


def test_l1_selection_sheet_rows_add_static_activations_and_overhead() -> None:
    sheet = _sheet()
    static = 16 * TOTAL  # fp32 weights + gradients + AdamW state
    act = MODEL.activation_bytes(8, 1024)
    configured = _row(sheet, "configured")
    assert configured["static_bytes_per_gpu"] == static
    assert configured["peak_bytes_per_gpu"] == int(static + act + DEFAULT_OVERHEAD_BYTES)
    assert configured["examples_per_update"] == 16 and configured["estimate"] == ""
    for key in ("precision", "microbatch", "accumulation", "strategy", "world_size"):
        assert key in sheet
    assert sheet["expected_result"].startswith("macro-F1")
    assert sheet["max_dims"]["length"] == 1024
    # 16 GB static + 29 GB activations + 1 GiB: no 40 GB card, the 80 GB cards with headroom.
    fits = configured["fits"]
    assert fits["A100 40GB"]["verdict"] == "FAIL"
    assert "more than it has" in fits["A100 40GB"]["sentence"]
    assert fits["A100 80GB"]["verdict"] == "PASS"
    expected = 1 - configured["peak_bytes_per_gpu"] / (79.2 * GIB)
    assert fits["A100 80GB"]["headroom"] == pytest.approx(expected, abs=1e-4)


def test_l1_selection_sheet_alternatives_follow_s6_and_label_estimates() -> None:
    sheet = _sheet()
    labels = [r["label"] for r in sheet["rows"]]
    assert labels[:6] == [
        "configured",
        "microbatch 4 x accumulation 4",
        "microbatch 2 x accumulation 8",
        "microbatch 1 x accumulation 16",
        "activation checkpointing",
        "bf16 autocast",
    ]
    one = _row(sheet, "microbatch 1 x accumulation 16")
    assert one["examples_per_update"] == 16  # the effective batch is kept
    assert one["activation_bytes"] == int(MODEL.activation_bytes(1, 1024))
    ckpt = _row(sheet, "activation checkpointing")
    assert ckpt["activation_bytes"] == int(MODEL.activation_bytes(8, 1024) * CHECKPOINTING_KEEPS)
    assert "assumed" in ckpt["estimate"]
    bf16 = _row(sheet, "bf16 autocast")
    assert bf16["activation_bytes"] == int(MODEL.activation_bytes(8, 1024) / 2)
    assert "scaled to bf16" in bf16["estimate"]
    on_cpu = _row(_sheet(measured_on="cpu"), "configured")
    assert on_cpu["estimate"] == "activations measured as CPU RSS, not by a GPU allocator"
    assert bf16["fits"]["T4"]["sentence"] == "T4 has no bf16"
    ddp, fsdp = _row(sheet, "DDP x 2 GPUs"), _row(sheet, "FSDP x 2 GPUs")
    configured = _row(sheet, "configured")
    assert ddp["peak_bytes_per_gpu"] == configured["peak_bytes_per_gpu"]  # a full replica each
    assert ddp["accumulation"] == 1 and ddp["examples_per_update"] == 16
    assert fsdp["static_bytes_per_gpu"] == 16 * TOTAL // 2  # sharded state
    assert _row(sheet, "FSDP x 8 GPUs")["static_bytes_per_gpu"] == 16 * TOTAL // 8


def test_l1_smaller_microbatch_rescues_a_shape_that_does_not_fit_the_named_card() -> None:
    sheet = _sheet(gpu="A100 40GB")
    assert _row(sheet, "configured")["fits"]["A100 40GB"]["verdict"] == "FAIL"
    assert sheet["recommendation"]["row"] == "microbatch 4 x accumulation 4"
    assert sheet["recommendation"]["card"] == "A100 40GB"
    with pytest.raises(InputError, match="no card `B300`"):
        _sheet(gpu="B300")


def test_l2_selection_sheet_recommends_only_a_stack_checked_on_that_backend() -> None:
    unchecked = _sheet(stack_checked=False)
    assert unchecked["candidate"] == {
        "row": "configured",
        "card": "A100 80GB",
        "backend": "cuda",
        "headroom": _row(unchecked, "configured")["fits"]["A100 80GB"]["headroom"],
    }
    assert unchecked["recommendation"] is None
    assert "gates have not passed" in unchecked["recommendation_sentence"]
    on_cpu = _sheet(checked_backend="cpu")
    assert on_cpu["recommendation"] is None
    assert "checked on cpu, not on cuda" in on_cpu["recommendation_sentence"]
    checked = _sheet()
    assert checked["recommendation"] == checked["candidate"]
    assert "stack passed on cuda" in checked["recommendation_sentence"]


def test_l1_max_microbatch_per_card_at_the_longest_length() -> None:
    sheet = _sheet()
    per_example = MODEL.activation_bytes(1, 1024)
    room = 79.2 * GIB * 0.9 - 16 * TOTAL - DEFAULT_OVERHEAD_BYTES
    assert sheet["max_dims"]["max_microbatch_at_length"]["A100 80GB"] == int(room // per_example)
    assert sheet["max_dims"]["max_microbatch_at_length"]["T4"] == 0
