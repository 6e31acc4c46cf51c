"""The per-card sheet (L1, L3, S3, B3, B4) on hand-made dry runs of an 8B-shaped
LoRA step whose bytes and FLOPs are known exactly, so every number the sheet derives can be
checked by hand: fit and headroom, the largest microbatch with and without activation
checkpointing, the base dtypes that fit, DDP vs FSDP per GPU, hours from FLOPs, the package."""

from __future__ import annotations

import math

import pytest

from sizing_support import (
    CONTEXT,
    GIB,
    LAYERS,
    LENGTH,
    PARAMS,
    PER_EXAMPLE,
    TRAINABLE,
    fake_dry_run,
)
from tunepilot.sizing.catalog import load_catalog
from tunepilot.sizing.recommend import recommendation
from tunepilot.sizing.sheet import DryRuns, Linear, SheetInputs, card_rows
from tunepilot.sizing.sheet_markdown import sheet_markdown
from tunepilot.sizing.timing import seconds_on

CATALOG = load_catalog()


def inputs(microbatch: int = 2, checkpointing: bool = False) -> SheetInputs:
    return SheetInputs(microbatch=microbatch, accumulation=8, max_length=LENGTH,
                       checkpointing=checkpointing, base_dtype="bf16", precision="bf16",
                       eval_batches=10, updates_per_run=600, n_variants=2, n_seeds=2,
                       evals_per_run=6, checkpoints_per_run=1, margin=0.2,
                       packages=(3, 7, 30))  # fmt: skip


@pytest.fixture(scope="module")
def sheet():
    runs = DryRuns(fake_dry_run)
    flops_io = None

    def seconds_for(card):
        from tunepilot.sizing.sheet import work_of

        nonlocal flops_io
        flops_io = flops_io or work_of(runs(inputs().setting), inputs())
        return seconds_on(card, CATALOG, *flops_io)

    return runs, card_rows(runs, inputs(), CATALOG, seconds_for=seconds_for)


def row(sheet: dict, card: str) -> dict:
    return next(r for r in sheet["rows"] if r["card"] == card)


def test_l1_sheet_has_a_row_per_catalog_card_with_fit_and_headroom(sheet) -> None:
    runs, s = sheet
    assert [r["card"] for r in s["rows"]] == [c.name for c in CATALOG.cards]
    peak = 2 * PARAMS + 12 * TRAINABLE + 2 * 3 * GIB + GIB // 4  # first step at microbatch 2
    h100 = row(s, "H100 80GB")["configured"]
    assert h100["peak_bytes"] == peak + CONTEXT and h100["verdict"] == "PASS"
    assert h100["headroom"] == pytest.approx(1 - (peak + CONTEXT) / (79.1 * GIB), abs=1e-4)
    assert row(s, "T4")["configured"]["verdict"] == "FAIL"
    assert "more" in row(s, "T4")["configured"]["sentence"]
    assert row(s, "H100 80GB")["peak_phase"] == "first step"  # its temporaries are larger


def test_s3_largest_microbatch_from_two_dry_runs_exact_slope_with_and_without_checkpointing(
    sheet,
) -> None:
    runs, s = sheet
    budget = 79.1 * GIB * 0.9 - CONTEXT
    at_one = 2 * PARAMS + 12 * TRAINABLE + GIB // 4  # the first step's fixed part is the larger
    for on in (False, True):
        expected = 1 + int((budget - at_one - PER_EXAMPLE[on]) // PER_EXAMPLE[on])
        key = "with checkpointing" if on else "without checkpointing"
        assert row(s, "H100 80GB")["largest_microbatch"][key] == expected
    big = row(s, "H100 80GB")["largest_microbatch"]
    assert big["with checkpointing"] > 5 * big["without checkpointing"]
    assert row(s, "T4")["largest_microbatch"]["without checkpointing"] == 0
    # Microbatch 1 and 2 per checkpointing setting, the base dtypes and the other precision:
    # seven dry runs, each once, never one per microbatch.
    assert runs.count == s["dry_runs"] == 7


def test_s3_checkpointing_and_precision_each_sized_with_memory_and_time_effect(sheet) -> None:
    _, s = sheet
    ckpt = s["checkpointing"]
    assert ckpt["off"]["peak_bytes"] - ckpt["on"]["peak_bytes"] == 2 * (3 * GIB - GIB // 2)
    assert ckpt["on"]["steady_flops"] / ckpt["off"]["steady_flops"] == pytest.approx(8 / 6)
    assert "+33% FLOPs" in ckpt["sentence"] and "assumed" not in ckpt["sentence"]
    prec = s["precision"]
    assert prec["other"] == "fp32"
    assert prec["peak_bytes"]["fp32"] - prec["peak_bytes"]["bf16"] == 2 * 3 * GIB
    assert prec["peak_speedup"]["H100 80GB"] == pytest.approx(67.0 / 989.4)
    assert prec["peak_speedup"]["T4"] is None  # no bf16 on a T4: no ratio to give


def test_l1_base_dtypes_that_fit_per_card(sheet) -> None:
    _, s = sheet
    assert s["base_dtypes"]["fp32"] > s["base_dtypes"]["bf16"] > s["base_dtypes"]["nf4"]
    assert row(s, "A100 40GB")["base_dtypes_that_fit"] == ["bf16", "nf4"]
    assert row(s, "L4")["base_dtypes_that_fit"] == ["nf4"]
    assert row(s, "H200 141GB")["base_dtypes_that_fit"] == ["fp32", "bf16", "nf4"]


def test_b4_ddp_vs_fsdp_bytes_per_gpu_on_a_multi_gpu_machine(sheet) -> None:
    _, s = sheet
    multi = row(s, "8x H100 80GB")["multi_gpu"]
    peak = 2 * PARAMS + 12 * TRAINABLE + 2 * 3 * GIB + GIB // 4
    state = 2 * PARAMS + 12 * TRAINABLE
    assert multi["ddp_per_gpu"]["peak_bytes"] == peak + 4 * TRAINABLE + CONTEXT
    fsdp = peak - state + math.ceil(state / 8) + 2 * PARAMS // LAYERS + CONTEXT
    assert multi["fsdp_per_gpu"]["peak_bytes"] == fsdp
    assert row(s, "H100 80GB")["multi_gpu"] is None


def test_l3_package_hours_come_from_the_dry_runs_flops_and_the_labelled_mfu(sheet) -> None:
    _, s = sheet
    pkg = row(s, "H100 80GB")["package"]
    update = 6 * PARAMS * 2 * LENGTH * 8 / (989.4e12 * CATALOG.assumed_mfu)
    assert pkg["plan"]["workload"]["seconds_per_update"] == pytest.approx(update)
    assert not pkg["measured"] and pkg["days"] == 3
    assert "fill in the price" in pkg["cost"]
    assert row(s, "T4")["package"] is None and "does not fit the T4" in row(s, "T4")["basis"]
    assert "ASSUMPTION" in s["hours_basis"] and "MFU" in s["hours_basis"]


def test_l2_recommendation_needs_a_stack_checked_on_the_cards_backend(sheet) -> None:
    _, s = sheet
    chosen, why = recommendation(s, set())
    assert chosen is None and "not recommended yet" in why and "A100 40GB" in why
    chosen, why = recommendation(s, {"cuda"})
    assert chosen["card"] == "A100 40GB" and "headroom" in why


def test_l1_sheet_markdown_shows_phases_every_card_s3_and_assumptions(sheet) -> None:
    _, s = sheet
    md = sheet_markdown(s, recommendation(s, set())[1])
    assert md.startswith("## Per-card sheet") and "| steady step |" in md
    for card in CATALOG.cards:
        assert f"| {card.name} |" in md
    assert "activation checkpointing at microbatch 2" in md and "Hours: computed" in md
    assert "Assumptions:" in md and "NOT scaled" not in md


def test_s3_linear_model_is_exact_and_says_when_nothing_grows() -> None:
    lin = Linear({"a": 100, "b": 50}, {"a": 10, "b": 0})
    assert lin.peak(3) == 120 and lin.largest_microbatch(125) == 3
    assert lin.largest_microbatch(99) == 0
    assert Linear({"a": 100}, {"a": 0}).largest_microbatch(200) is None
