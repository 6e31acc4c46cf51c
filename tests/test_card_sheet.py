"""The per-card sheet (L1, S3, B3, B4, L2, L3) on hand-made dry runs of an 8B-shaped LoRA step
whose bytes and FLOPs are known exactly, so every number the sheet derives can be checked by
hand: the one verdict per card and the phase that decides it, the largest microbatch with and
without activation checkpointing, the base dtypes that fit, DDP vs FSDP per GPU, the layout a
multi-GPU machine runs, hours from FLOPs and the calibrated utilisation, the package, the
ranking. The same sheet on real dry runs is in test_plan_verdict.py."""

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
from tunepilot.sizing.recommend import rank_key, ranked, recommendation
from tunepilot.sizing.sheet import DryRuns, Linear, SheetInputs, card_rows, work_of
from tunepilot.sizing.sheet_markdown import sheet_markdown
from tunepilot.sizing.throughput import LORA, scaling_efficiency
from tunepilot.sizing.timing import seconds_on

CATALOG = load_catalog()


def inputs(microbatch: int = 2, checkpointing: bool = False, base_unset: bool = False,
           precision: str = "bf16") -> SheetInputs:  # fmt: skip
    return SheetInputs(microbatch=microbatch, accumulation=8, max_length=LENGTH,
                       checkpointing=checkpointing, base_dtype="bf16", precision=precision,
                       eval_batches=10, updates_per_run=600, n_variants=2, n_seeds=2,
                       evals_per_run=6, checkpoints_per_run=1, margin=0.2,
                       packages=(3, 7, 30), base_unset=base_unset, eval_batch=8)  # fmt: skip


def make_sheet(given: SheetInputs) -> tuple[DryRuns, dict]:
    runs = DryRuns(fake_dry_run, announce=False)

    def seconds_for(card, dry):
        return seconds_on(card, CATALOG, *work_of(dry, given))

    return runs, card_rows(runs, given, CATALOG, seconds_for=seconds_for)


@pytest.fixture(scope="module")
def sheet():
    return make_sheet(inputs())


def row(sheet: dict, card: str) -> dict:
    return next(r for r in sheet["rows"] if r["card"] == card)


def test_l1_sheet_has_a_row_per_catalog_card_with_its_verdict_and_deciding_phase(sheet) -> None:
    runs, s = sheet
    assert [r["card"] for r in s["rows"]] == [c.name for c in CATALOG.cards]
    peak = 2 * PARAMS + 12 * TRAINABLE + 2 * 3 * GIB + GIB // 4  # first step at microbatch 2
    h100 = row(s, "H100 80GB")["configured"]
    assert h100["peak_bytes"] == peak + CONTEXT and h100["verdict"] == "PASS"
    assert h100["headroom"] == pytest.approx(1 - (peak + CONTEXT) / (79.1 * GIB), abs=1e-4)
    assert h100["phase"] == "first step" and "first step decides" in h100["sentence"]
    assert h100["need_by_phase"]["evaluation"] == 2 * PARAMS + 8 * TRAINABLE + GIB + CONTEXT
    assert row(s, "A10")["configured"]["verdict"] == "WARN"  # 21.9 GiB of 22.0: under 10% free
    assert "only" in row(s, "A10")["configured"]["sentence"]
    assert row(s, "RTX 4090")["configured"]["verdict"] == "WARN"
    t4 = row(s, "T4")["configured"]
    assert t4["verdict"] == "FAIL" and "has no bf16" in t4["sentence"]


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
    # Microbatch 1 and 2 per checkpointing setting, the base dtypes, the other precision and
    # the evaluation batch at 1: eight dry runs, each once, never one per microbatch or card.
    assert runs.count == s["dry_runs"] == 8


def test_s3_each_option_is_sized_on_the_phase_it_changes(sheet) -> None:
    _, s = sheet
    ckpt = s["checkpointing"]
    saved = ckpt["off"]["training_peak"] - ckpt["on"]["training_peak"]
    assert saved == 2 * (3 * GIB - GIB // 2)
    assert ckpt["on"]["steady_flops"] / ckpt["off"]["steady_flops"] == pytest.approx(8 / 6)
    assert "+33% FLOPs" in ckpt["sentence"] and "on the training step" in ckpt["sentence"]
    prec = s["precision"]
    assert prec["other"] == "fp32"
    assert prec["peak_bytes"]["fp32"] - prec["peak_bytes"]["bf16"] == 2 * 3 * GIB
    # A bf16 base computes its matmuls in bf16 with either training precision: same time.
    assert prec["peak_speedup"]["H100 80GB"] == pytest.approx(1.0)
    assert prec["peak_speedup"]["T4"] is None  # no bf16 on a T4: no ratio to give
    ev = s["eval_batch"]
    assert ev["peak_bytes"][8] - ev["peak_bytes"][1] == GIB - GIB // 8
    assert not ev["decides"] and "first step does" in ev["sentence"]


def test_l1_base_dtypes_that_fit_per_card(sheet) -> None:
    _, s = sheet
    assert s["base_dtypes"]["fp32"] > s["base_dtypes"]["bf16"] > s["base_dtypes"]["nf4"]
    assert row(s, "A100 40GB")["base_dtypes_that_fit"] == ["bf16", "nf4"]
    assert row(s, "L4")["base_dtypes_that_fit"] == ["nf4"]
    assert row(s, "H200 141GB")["base_dtypes_that_fit"] == ["fp32", "bf16", "nf4"]


def test_b3_b4_ddp_vs_fsdp_bytes_per_gpu_on_a_multi_gpu_machine(sheet) -> None:
    _, s = sheet
    layouts = {x["layout_kind"]: x for x in row(s, "8x H100 80GB")["layouts"]}
    assert set(layouts) == {"side by side", "ddp", "fsdp"}
    peak = 2 * PARAMS + 12 * TRAINABLE + 2 * 3 * GIB + GIB // 4
    state = 2 * PARAMS + 12 * TRAINABLE
    assert layouts["ddp"]["need_by_phase"]["first step"] == peak + 4 * TRAINABLE + CONTEXT
    fsdp = peak - state + math.ceil(state / 8) + 2 * PARAMS // LAYERS + CONTEXT
    assert layouts["fsdp"]["need_by_phase"]["first step"] == fsdp
    assert layouts["side by side"]["peak_bytes"] == peak + CONTEXT
    assert row(s, "H100 80GB")["layouts"] is None


def test_b3_a_multi_gpu_machine_plans_the_fastest_layout_that_fits_and_labels_its_scaling(
    sheet,
) -> None:
    _, s = sheet
    r = row(s, "8x H100 80GB")
    choice = r["layout_choice"]
    hours = {k: float(choice.split(f"{k} ")[1].split(" h")[0])
             for k in ("8 runs side by side, one per GPU", "DDP over 8", "FSDP over 8")}
    assert r["package"]["hours"] == pytest.approx(min(hours.values()), abs=0.06)
    assert choice.startswith(r["configured"]["layout"]) and "the fastest layout" in choice
    # A single run over 8 GPUs goes 8 x the calibrated efficiency faster than on one GPU.
    one = row(s, "H100 80GB")["package"]["plan"]["workload"]["seconds_per_update"]
    layouts = {x["layout_kind"]: x for x in r["layouts"]}
    assert all(layouts[k]["verdict"] == "PASS" for k in layouts)
    if r["configured"]["layout_kind"] in ("ddp", "fsdp"):
        update = r["package"]["plan"]["workload"]["seconds_per_update"]
        assert update == pytest.approx(one / 8 / scaling_efficiency(8))
        assert "scaling efficiency" in r["basis"]


def test_l3_package_hours_come_from_the_dry_runs_flops_and_the_calibrated_utilisation(sheet):
    _, s = sheet
    pkg = row(s, "H100 80GB")["package"]
    update = 6 * PARAMS * 2 * LENGTH * 8 / (989.4e12 * LORA.expected)
    assert pkg["plan"]["workload"]["seconds_per_update"] == pytest.approx(update)
    assert not pkg["measured"] and pkg["days"] == 3
    low, high = pkg["hours_range"]
    assert low < pkg["hours"] < high
    assert "fill in the price" in pkg["cost"]
    assert "calibrated on three published" in s["hours_basis"]
    assert f"{LORA.expected:.0%}, range" in s["hours_basis"]
    assert "ASSUMED" in s["hours_basis"]  # the disk speed still is one


def test_b1_every_package_starts_with_the_re_pilot_naming_the_cards_stack(sheet) -> None:
    _, s = sheet
    planned = [r for r in s["rows"] if r["package"]]
    assert len(planned) > 5
    for r in planned:
        first = r["package"]["plan"]["phases"][0]
        assert first["name"] == "re-pilot on this card" and first["hours"] > 0
        assert first["commands"][0] == f'tunepilot pilot campaign.yaml --gpu "{r["card"]}"'
        assert r["package"]["plan"]["workload"]["final_evals"] == 1  # the sealed test once
    rocm = row(s, "MI300X 192GB")["package"]["plan"]["phases"][0]["sentence"]
    assert "ROCm on gfx942, ROCm 6.0 or later" in rocm
    assert "CUDA on sm_90" in row(s, "H100 80GB")["package"]["plan"]["phases"][0]["sentence"]


def test_l1_a_row_that_does_not_pass_has_no_hours_package_or_cost(sheet) -> None:
    _, s = sheet
    failing = [r for r in s["rows"] if r["configured"]["verdict"] != "PASS"]
    assert {"T4", "L4", "RTX 4090"} <= {r["card"] for r in failing}
    md = sheet_markdown(s, recommendation(s, set())[1])
    for r in failing:
        assert r["package"] is None and r["basis"].startswith("no hours:")
        line = next(x for x in md.splitlines() if x.startswith(f"| {r['card']} |"))
        assert "| n/a |" in line and "days" not in line and "price" not in line
    for r in s["rows"]:
        if r["configured"]["verdict"] == "PASS":
            assert r["package"] is not None


def test_l1_t4_has_no_bf16_so_a_bf16_step_fails_there_and_an_unset_base_loads_fp32() -> None:
    _, configured = make_sheet(inputs())  # model.base_dtype bf16, training.precision bf16
    t4 = row(configured, "T4")["configured"]
    assert t4["verdict"] == "FAIL" and t4["missing_precisions"] == ["bf16"]
    assert "has no bf16" in t4["sentence"]
    runs, unset = make_sheet(inputs(base_unset=True, precision="fp32"))
    assert row(unset, "T4")["base_dtype"] == "fp32" and row(unset, "L4")["base_dtype"] == "bf16"
    assert row(unset, "T4")["configured"]["missing_precisions"] == []  # fp32 on the T4 runs
    assert not row(unset, "T4")["largest_microbatch"]["sized"]


def test_l2_recommendation_needs_a_stack_checked_on_the_cards_backend(sheet) -> None:
    _, s = sheet
    chosen, why = recommendation(s, set())
    assert chosen is None and "not recommended yet" in why and "A100 40GB" in why
    chosen, why = recommendation(s, {"cuda"})
    assert chosen["card"] == "A100 40GB" and "smallest machine that fits" in why
    assert [r["card"] for r in ranked(s)][0] == "A100 40GB"


def test_l2_ranking_by_price_then_whole_gib_then_peak_flops_then_name() -> None:
    def r(card, gib, flops, gpus=1, price=None):
        return {"card": card, "memory_bytes": int(gib * GIB), "gpus": gpus,
                "machine_peak_flops": flops, "package": {"price": price},
                "configured": {"verdict": "PASS"}}  # fmt: skip

    h100, a100 = r("H100 80GB", 79.1, 989e12), r("A100 80GB", 79.2, 312e12)
    eight = r("8x A100 80GB", 79.2, 8 * 312e12, gpus=8)
    mi300 = r("MI300X 192GB", 191.5, 1307e12)
    order = sorted([h100, eight, mi300, a100], key=rank_key)
    # 79.1 and 79.2 GiB are one class: the A100 (less peak) is the smaller card.
    assert [x["card"] for x in order] == ["A100 80GB", "H100 80GB", "MI300X 192GB",
                                          "8x A100 80GB"]  # fmt: skip
    priced = [r("H100 80GB", 79.1, 989e12, price=900.0), r("A100 80GB", 79.2, 312e12, price=950.0),
              r("8x A100 80GB", 79.2, 8 * 312e12, gpus=8, price=500.0), mi300]  # fmt: skip
    assert [x["card"] for x in sorted(priced, key=rank_key)] == [
        "8x A100 80GB", "H100 80GB", "A100 80GB", "MI300X 192GB"]  # unpriced last
    twins = [r("B", 80, 1e15), r("A", 80, 1e15)]
    assert [x["card"] for x in sorted(twins, key=rank_key)] == ["A", "B"]


def test_l1_sheet_markdown_shows_phases_every_card_s3_and_assumptions(sheet) -> None:
    _, s = sheet
    md = sheet_markdown(s, recommendation(s, set())[1])
    assert md.startswith("## Per-card sheet") and "| steady step |" in md
    for card in CATALOG.cards:
        assert f"| {card.name} |" in md
    assert "activation checkpointing at microbatch 2, on the training step" in md
    assert "training.eval_batch_size 8, on evaluation" in md and "Ranking:" in md
    assert "Hours: computed" in md and "deciding phase" in md
    assert "Assumptions:" in md and "NOT scaled" not in md


def test_s3_linear_model_is_exact_and_says_when_nothing_grows() -> None:
    lin = Linear({"a": 100, "b": 50}, {"a": 10, "b": 0})
    assert lin.peak(3) == 120 and lin.largest_microbatch(125) == 3
    assert lin.largest_microbatch(99) == 0
    assert Linear({"a": 100}, {"a": 0}).largest_microbatch(200) is None
