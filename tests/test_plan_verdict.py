"""One verdict per card, on real dry runs (L1, L2, S3, S4, B1): the tiny extraction campaign
sized by `sizing.dry_run` on the CUDA path (no GPU), judged against a catalog of cards made to
sit on either side of its phases, and the same verdict from `plan`, its sheet and `size`.

The evaluation batch is large and the microbatch small, so evaluation decides the peak: the
case where a peak over all phases hides what activation checkpointing does to the training
step (S3) and where a card fits the training step but not evaluation (S4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sizing_support import tiny_llama_campaign
from tunepilot.data.workspace import Workspace

MIB = 2**20
SHAPE = ["training.microbatch=1", "training.accumulation=4", "training.eval_batch_size=512",
         "training.precision=bf16"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """(campaign, catalog, needs): a catalog whose `Tiny-fits` holds every phase, whose
    `Tiny-eval` holds the training step but not evaluation, and the shipped T4 (no bf16)."""
    from tunepilot.sizing.dry_run.run import dry_run
    from tunepilot.sizing.fit import Layout, per_gpu_bytes

    folder = tmp_path_factory.mktemp("verdict")
    path = tiny_llama_campaign(folder)
    dry = dry_run(Workspace.open(path, SHAPE), base_dtype="bf16")
    need = {k: v + dry.cuda_context_bytes for k, v in per_gpu_bytes(dry, Layout("one GPU")).items()}
    train, evaluation = max(need["first step"], need["steady step"]), need["evaluation"]
    assert evaluation > train + 20 * MIB  # the shape makes evaluation decide
    peaks = "{fp32: 30.0, tf32: 60.0, bf16: 120.0, fp16: 120.0}"
    between = (train / 0.9 + evaluation) / 2 / 2**30  # training PASSes, evaluation FAILs
    assert train / 0.9 < evaluation
    catalog = folder / "gpus.yaml"
    catalog.write_text(
        "assumed_disk_gb_s: 1.0\ncards:\n"
        f"  - {{name: Tiny-fits, memory_gib: {evaluation / 0.8 / 2**30:.6f}, backend: cuda, "
        f"peak_tflops: {peaks}, bandwidth_gb_s: 500, source: test, arch: sm_80, stack: CUDA}}\n"
        f"  - {{name: Tiny-eval, memory_gib: {between:.6f}, backend: cuda, "
        f"peak_tflops: {peaks}, bandwidth_gb_s: 500, source: test, arch: sm_80, stack: CUDA}}\n"
        "  - {name: T4, memory_gib: 15.0, backend: cuda, peak_tflops: {fp32: 8.1, fp16: 65.0}, "
        "bandwidth_gb_s: 320, source: test, arch: sm_75, stack: CUDA}\n",
        encoding="utf-8",
    )
    return path, catalog, {"train": train, "evaluation": evaluation}


@pytest.fixture(scope="module")
def planned(tiny) -> tuple[int, dict, list[int]]:
    """`tunepilot plan --gpu Tiny-eval --json` in this process: (exit code, its document, the
    dry runs the nearest-change search executed, counted at the runner)."""
    import contextlib
    import io

    from tunepilot.pilot import plan as plan_module

    path, catalog, _ = tiny
    executed: list[int] = []
    real = plan_module.override_runner

    def counting(ws, card):
        run = real(ws, card)

        def counted(overrides):
            executed.append(len(overrides))
            return run(overrides)

        return counted

    plan_module.override_runner = counting
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            code = plan_module.run_plan(Workspace.open(path, SHAPE), gpu="Tiny-eval",
                                        as_json=True, catalog=catalog)  # fmt: skip
    finally:
        plan_module.override_runner = real
    return code, json.loads(_json(out)), executed


def _json(buffer) -> str:
    text = buffer.getvalue()
    return text[text.index("{"):]


def row(doc: dict, card: str) -> dict:
    return next(r for r in doc["sheet"]["rows"] if r["card"] == card)


def test_s3_checkpointing_is_judged_on_the_training_step_when_evaluation_decides_the_peak(
    planned,
) -> None:
    """A real dry run: evaluation decides the peak, yet checkpointing's saving on the training
    step is reported (a peak over all phases said "0 B saved")."""
    _, doc, _ = planned
    sheet = doc["sheet"]
    assert sheet["peak_phase"] == "evaluation"
    ckpt = sheet["checkpointing"]
    assert ckpt["off"]["peak_phase"] == ckpt["on"]["peak_phase"] == "evaluation"
    assert ckpt["off"]["peak_bytes"] == ckpt["on"]["peak_bytes"]  # what masked the effect
    saved = ckpt["off"]["training_peak"] - ckpt["on"]["training_peak"]
    assert saved > 0 and "(0 B saved)" not in ckpt["sentence"]
    assert "on the training step" in ckpt["sentence"] and "evaluation decides it" in (
        ckpt["sentence"])
    assert ckpt["on"]["steady_flops"] > ckpt["off"]["steady_flops"]  # the recomputed forward
    ev = sheet["eval_batch"]
    assert ev["decides"] and ev["peak_bytes"]["512"] > ev["peak_bytes"]["1"]


def test_l1_each_row_says_its_verdict_and_the_phase_that_decides_it(planned, tiny) -> None:
    _, doc, _ = planned
    _, _, need = tiny
    fits, short = row(doc, "Tiny-fits")["configured"], row(doc, "Tiny-eval")["configured"]
    assert fits["verdict"] == "PASS" and fits["phase"] == "evaluation"
    assert fits["peak_bytes"] == need["evaluation"]
    assert short["verdict"] == "FAIL" and short["phase"] == "evaluation"
    assert "over the budget: evaluation" in short["sentence"]  # the training step fits
    assert row(doc, "Tiny-fits")["package"] is not None


def test_l1_plan_on_a_card_that_fails_exits_1_with_the_nearest_change_each_an_executed_dry_run(
    planned,
) -> None:
    code, doc, executed = planned
    assert code == 1 and doc["fits"] is False and "plan" not in doc
    assert "package" not in doc["sentence"] or "no rental plan" in doc["sentence"]
    near = doc["nearest_change"]
    assert near["fits"] and near["overrides"][-1].startswith("training.eval_batch_size=")
    kept = int(near["overrides"][-1].split("=")[1])
    assert 1 <= kept < 512
    # Every trial listed is a dry run that was executed, and the last one is the PASS.
    assert len(near["trials"]) == len(executed) >= 1
    assert near["trials"][-1]["verdict"] == "PASS" and near["trials"][-1]["overrides"] == (
        near["overrides"])
    assert all(t["verdict"] != "PASS" for t in near["trials"][:-1])
    assert "activation_checkpointing" not in " ".join(near["overrides"])  # evaluation decides
    for r in doc["sheet"]["rows"]:
        if r["configured"]["verdict"] != "PASS":
            assert r["package"] is None


def test_l1_the_t4_has_no_bf16_and_the_nearest_change_is_fp16_tried_for_real(
    planned, tiny
) -> None:
    from tunepilot.pilot.plan import override_runner
    from tunepilot.sizing.catalog import load_catalog
    from tunepilot.sizing.fit import Fit, Layout
    from tunepilot.sizing.nearest import nearest_change

    _, doc, _ = planned
    t4 = row(doc, "T4")
    assert t4["configured"]["verdict"] == "FAIL" and t4["package"] is None
    assert t4["configured"]["missing_precisions"] == ["bf16"] and t4["base_dtype"] == "fp32"
    path, catalog, _ = tiny
    ws = Workspace.open(path, SHAPE)
    card = load_catalog(catalog).card("T4")
    c = t4["configured"]
    current = Fit("T4", Layout("one GPU"), c["verdict"], c["headroom"], c["need_by_phase"],
                  c["phase"], c["sentence"], c["missing_precisions"])  # fmt: skip
    near = nearest_change(card, current, ws.campaign, override_runner(ws, card))
    assert near["fits"] and near["overrides"] == ["training.precision=fp16"]
    assert near["trials"][0]["verdict"] == "PASS"


def test_l1_size_gives_the_same_verdict_as_the_plans_sheet(planned, tiny, capsys) -> None:
    from tunepilot.sizing.dry_run.flow import run_size

    _, doc, _ = planned
    path, catalog, _ = tiny
    code = run_size(Workspace.open(path, SHAPE), gpus=["Tiny-eval", "Tiny-fits", "T4"],
                    as_json=True, catalog=catalog)  # fmt: skip
    printed = capsys.readouterr().out
    fits = {f["gpu"]: f for f in json.loads(printed[printed.index("{"):])["fits"]}
    assert code == 1  # an asked card does not PASS
    for name in ("Tiny-eval", "Tiny-fits", "T4"):
        sheet = row(doc, name)["configured"]
        assert (fits[name]["verdict"], fits[name]["phase"], fits[name]["peak_bytes"]) == (
            sheet["verdict"], sheet["phase"], sheet["peak_bytes"])
    assert fits["T4"]["base_dtype"] == "fp32"  # what a run loads on a card without bf16


def test_s4_l3_lengths_come_from_the_campaigns_tokenizer_as_a_stated_proxy(tiny) -> None:
    """A shipped config has no tokenizer: the campaign's own measures the data (said so),
    steps are sized at the longest training example, evaluation at the longest validation or
    test one, hours at the mean padded length; without any tokenizer, max_length and a
    caveat that it is an upper bound."""
    from tunepilot.pilot.plan import lengths_caveat
    from tunepilot.sizing.dry_run.run import dry_run
    from tunepilot.sizing.sheet import sheet_inputs, work_of

    path, _, _ = tiny
    ws = Workspace.open(path, ["model.name_or_path=llama-3-8b-config", "data.max_length=2048"])
    dry = dry_run(ws, base_dtype="bf16")
    steady, evaluation = dry.phase("steady step"), dry.phase("evaluation")
    assert "PROXY" in dry.lengths_source and "base-model" in dry.lengths_source
    assert steady.inputs["length"] < 2048 and evaluation.inputs["length"] < 2048
    assert dry.mean_length < steady.inputs["length"]
    assert any("PROXY" in n for n in dry.notes)
    inputs = sheet_inputs(ws.campaign, 100, 10, "bf16")
    flops, _ = work_of(dry, inputs)
    per_step = steady.flops * inputs.accumulation
    assert flops.per_update == pytest.approx(per_step * dry.mean_length / steady.inputs["length"])
    assert "PROXY" in lengths_caveat(dry, 2048)
    # A campaign file that itself names the shipped config: no tokenizer anywhere.
    text = path.read_text(encoding="utf-8").replace("name_or_path: base-model",
                                                    "name_or_path: llama-3-8b-config")
    assert "llama-3-8b-config" in text
    bare = path.with_name("bare.yaml")
    bare.write_text(text, encoding="utf-8")
    alone = dry_run(Workspace.open(bare, ["data.max_length=256"]), base_dtype="bf16")
    assert alone.mean_length is None and alone.phase("steady step").inputs["length"] == 256
    assert "upper bound" in lengths_caveat(alone, 256)


def test_l1_every_candidate_change_is_a_valid_campaign_override(tiny) -> None:
    """The nearest-change table is dotted `key=value` overrides: each one the table can
    propose is accepted by the campaign schema (a misspelt key would be exit 2 at run time)."""
    from tunepilot.campaign import load_campaign
    from tunepilot.sizing.nearest import CANDIDATES

    path, _, _ = tiny
    proposed = 0
    wider = [*SHAPE, "training.microbatch=2", "training.precision=fp32", "model.base_dtype=fp32"]
    for base in (SHAPE, wider, [*SHAPE, "training.accumulation=1"]):
        campaign = load_campaign(path, base)
        for candidate in CANDIDATES:
            for values in candidate.values(campaign):
                assert all("=" in v and v.split("=")[0].count(".") >= 1 for v in values)
                load_campaign(path, [*base, *values])
                proposed += 1
    assert proposed >= len(CANDIDATES)  # every candidate proposed at least once


def test_l1_the_fp16_change_covers_every_source_of_bf16_compute_at_once() -> None:
    """A card without bf16 needs every bf16 source changed in one trial: the autocast and a
    bf16 or 4-bit base (QLoRA computes in bf16); an unset base already loads fp32 there."""
    from types import SimpleNamespace as NS

    from tunepilot.sizing.nearest import CANDIDATES

    (fp16,) = [c for c in CANDIDATES if c.name.startswith("fp16")]

    def campaign(precision, base):
        return NS(training=NS(precision=precision), model=NS(base_dtype=base))

    assert fp16.values(campaign("bf16", "bf16")) == [["training.precision=fp16",
                                                      "model.base_dtype=fp16"]]  # fmt: skip
    assert fp16.values(campaign("bf16", None)) == [["training.precision=fp16"]]
    assert fp16.values(campaign("fp32", "nf4")) == [["model.base_dtype=fp16"]]
    assert fp16.values(campaign("fp32", None)) == []
