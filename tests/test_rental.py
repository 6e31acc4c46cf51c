"""The rental plan (L3) on hand-made timings: package choice, margin, cuts, several GPUs, and
the one sentence that says where the seconds come from."""

from __future__ import annotations

import pytest

from tunepilot.errors import InputError
from tunepilot.sizing.rental import plan_markdown, plan_rental
from tunepilot.sizing.timing import PhaseSeconds


def _seconds(update: float = 2.0, eval_pass: float = 120.0, checkpoint: float = 30.0,
             resume: float = 900.0, export: float = 600.0, measured: bool = True) -> PhaseSeconds:
    basis = "measured by pilot p-1 on the A100 40GB" if measured else "computed, not measured"
    return PhaseSeconds("A100 40GB", update, eval_pass, checkpoint, resume, export, measured,
                        basis)  # fmt: skip


def _plan(seconds: PhaseSeconds | None = None, **overrides):
    args = dict(updates_per_run=2000, n_variants=2, n_seeds=3, evals_per_run=4)
    args.update(overrides)
    return plan_rental(seconds or _seconds(), **args)


def _boundary(updates: int, **overrides):
    """Training time only (1 s per update, nothing else) so hours = updates / 3600 exactly."""
    args = dict(updates_per_run=updates, n_variants=0, n_seeds=1, evals_per_run=0)
    args.update(overrides)
    return plan_rental(_seconds(1.0, 0.0, 0.0, 0.0, 0.0), **args)


def test_l3_small_campaign_fits_the_3_day_package() -> None:
    plan = _plan(prices={3: 450.0, 7: 900.0, 30: 3000.0})
    # 1 control run + (2 variants x 3 seeds + 2 more control seeds) = 9 runs of 4030 s.
    assert plan.workload.experiment_runs == 8
    hours = {p.name: p.hours for p in plan.phases}
    assert list(hours) == [
        "re-pilot on this card",
        "initial control",
        "experiment",
        "evaluation",
        "resume rehearsal",
        "export",
    ]
    assert hours["initial control"] == pytest.approx((120 + 2000 * 2 + 30) / 3600)
    assert hours["experiment"] == pytest.approx(8 * 4030 / 3600)
    assert hours["evaluation"] == pytest.approx((9 * 4 * 120 + 1 * 120) / 3600)  # test once
    assert hours["resume rehearsal"] == pytest.approx(0.25)
    assert plan.total_hours == pytest.approx(sum(hours.values()))
    assert plan.chosen is not None and plan.chosen.days == 3
    assert plan.chosen.price == 450.0 and "450.00 for 3 days" in plan.sentence
    assert plan.measured and "(measured)" in plan.sentence


def test_b1_h4_every_package_starts_with_the_re_pilot_and_looks_at_the_sealed_test_once():
    from tunepilot.sizing.rental import PILOT_LOADS, repilot_seconds

    seconds = _seconds()
    repilot = repilot_seconds(seconds, examples_per_update=16, eval_batches=10)
    load = seconds.resume - seconds.update
    # Three loads, 5 updates, 100 overfit updates of 8 examples (half an update of 16), one
    # validation batch, a checkpoint, an export.
    assert repilot == pytest.approx(PILOT_LOADS * load + 5 * 2.0 + 100 * 2.0 * 0.5 + 12.0 + 30.0
                                    + 600.0)  # fmt: skip
    commands = {"re-pilot on this card": ('tunepilot pilot c.yaml --gpu "A100 40GB"',)}
    plan = _plan(repilot_seconds=repilot, commands=commands)
    first = plan.phases[0]
    assert first.name == "re-pilot on this card" and first.hours == pytest.approx(repilot / 3600)
    assert first.commands == commands["re-pilot on this card"] and "(B1)" in first.sentence
    assert "1 look at the sealed test split" in plan.phases[3].sentence
    md = plan_markdown(plan)
    assert '`tunepilot pilot c.yaml --gpu "A100 40GB"`' in md
    # The pilot's own constants: the re-pilot is the pilot's gates, counted as they run.
    from tunepilot.pilot import gates, overfit

    assert gates.STEADY_STEPS == 3 and (overfit.OVERFIT_MAX_UPDATES,
                                        overfit.OVERFIT_EXAMPLES) == (100, 8)  # fmt: skip


def test_l3_computed_hours_carry_the_utilisations_range() -> None:
    computed = _seconds(measured=False)
    spread = PhaseSeconds(**{**computed.to_json(), "spread": (0.8, 1.25)})
    plan = _plan(spread)
    low, high = plan.hours_range
    assert low < plan.total_hours < high and "h with the utilisation's range" in plan.sentence
    assert _plan().hours_range[0] == pytest.approx(_plan().total_hours)  # measured: no spread


def test_l3_bigger_campaign_needs_the_7_day_package() -> None:
    plan = _plan(updates_per_run=12_000, n_variants=3, n_seeds=3)  # 12 runs of ~6.7 h
    assert 57.6 < plan.total_hours <= 134.4
    assert [p.fits for p in plan.packages] == [False, True, True]
    assert plan.chosen.days == 7
    assert "fill in the price of the 7-day package" in plan.chosen.cost_sentence
    assert not plan.cuts


def test_l3_campaign_that_fits_nothing_says_what_to_cut_with_numbers_that_fit() -> None:
    plan = _plan(updates_per_run=100_000, n_variants=4, n_seeds=5)
    assert plan.chosen is None and all(not p.fits for p in plan.packages)
    assert "no package of 3, 7, 30 days fits" in plan.sentence
    kinds = [c.split(":")[0] for c in plan.cuts]
    assert kinds == ["fewer seeds", "fewer variants", "fewer updates", "more GPUs"]
    seeds = int(plan.cuts[0].split(": ")[1].split()[0])
    variants = int(plan.cuts[1].split(": ")[1].split()[0])
    updates = int(plan.cuts[2].split(": ")[1].split()[0])
    gpus = int(plan.cuts[3].split("with ")[1].split()[0])
    # Every proposed cut really fits the largest package, and one step less would not.
    assert _plan(updates_per_run=100_000, n_variants=4, n_seeds=seeds).chosen.days == 30
    assert _plan(updates_per_run=100_000, n_variants=variants, n_seeds=5).chosen.days == 30
    assert _plan(updates_per_run=updates, n_variants=4, n_seeds=5).chosen.days == 30
    assert _plan(updates_per_run=updates + 1, n_variants=4, n_seeds=5).chosen is None
    big = _plan(updates_per_run=100_000, n_variants=4, n_seeds=5, gpus_in_package=gpus)
    assert big.chosen.days == 30
    fewer = _plan(updates_per_run=100_000, n_variants=4, n_seeds=5, gpus_in_package=gpus - 1)
    assert fewer.chosen is None
    assert "What to cut" in plan_markdown(plan)


def test_l3_hopeless_campaign_says_so() -> None:
    plan = _boundary(updates=3_000_000)  # one run alone is 833 h
    assert plan.chosen is None
    assert any("nothing fits" in c or "fewer updates" in c for c in plan.cuts)


def test_l3_margin_is_respected_exactly_at_the_boundary() -> None:
    # 3 days = 72 h; 20% margin leaves 57.6 h = 207,360 s of work.
    at = _boundary(updates=207_360)
    assert at.total_hours == pytest.approx(57.6)
    assert at.chosen.days == 3 and at.chosen.headroom == pytest.approx(0.2)
    over = _boundary(updates=207_361)
    assert over.chosen.days == 7
    assert not over.packages[0].fits
    no_margin = _boundary(updates=259_200, margin=0.0)  # exactly 72 h
    assert no_margin.chosen.days == 3


def test_l3_several_gpus_run_variants_side_by_side_and_shorten_the_experiment() -> None:
    one = _plan(updates_per_run=12_000, n_variants=3, n_seeds=3)
    four = _plan(updates_per_run=12_000, n_variants=3, n_seeds=3, gpus_in_package=4)
    h1 = {p.name: p.hours for p in one.phases}
    h4 = {p.name: p.hours for p in four.phases}
    assert one.workload.waves == 11 and four.workload.waves == 3  # 11 experiment runs
    assert h4["experiment"] == pytest.approx(h1["experiment"] * 3 / 11)
    assert h4["initial control"] == h1["initial control"]  # the control comes first, alone
    assert four.total_hours < one.total_hours
    assert four.chosen.days == 3 and one.chosen.days == 7
    assert "side by side" in next(p.sentence for p in four.phases if p.name == "experiment")


def test_l3_a_plan_carries_one_basis_sentence_and_labels_computed_hours() -> None:
    computed = _plan(_seconds(measured=False))
    md = plan_markdown(computed)
    assert md.count("Basis:") == 1 and "computed, not measured" in md
    assert "NOT scaled" not in md and "scaled x" not in md
    assert "hours (computed)" in md and "(computed)" in computed.sentence
    measured = plan_markdown(_plan())
    assert measured.count("Basis:") == 1 and "hours (measured)" in measured
    assert "computed" not in measured


def test_l3_bad_inputs_are_reported_together() -> None:
    with pytest.raises(InputError) as err:
        _plan(_seconds(update=0.0), n_seeds=0, margin=1.5, gpus_in_package=0)
    where = {p.where for p in err.value.problems}
    assert where == {
        "plan.seconds per update", "plan.n_seeds", "rental.margin", "plan.gpus_in_package"
    }
