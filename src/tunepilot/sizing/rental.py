"""The rental plan (L3): hours per phase and the smallest 3-, 7- or 30-day package that fits.

The guide organises a rental around distinct phases. The first is always the pilot again on
the rented card (B1: a platform change means redoing start-up and quality checks; its
measured step then replaces the computed hours), then the initial control (baseline
evaluation and the control run), the experiment (variants x seeds), evaluation (the sealed
test looked at once, H4), a resume rehearsal (reload a checkpoint in a new process, R1) and
the export. Each phase is plain data (`PhaseHours`: name, hours, what, the commands that run
it) so a launcher can be written from it. Each phase's hours come from the seconds per unit of
work on the planned card (`timing.PhaseSeconds`): measured by a pilot on that card, or
computed from the dry run's FLOPs and labelled assumptions, with the range of the calibrated
utilisation. The plan carries that one basis sentence, never two.

A package fits when the campaign leaves at least `margin` of it free: with the default 20%,
a 3-day package (72 h) holds up to 57.6 h of work. The margin pays for what a plan cannot
see: a rerun after a crash, a slower data loader, a checkpoint re-read in a new process. When
nothing fits, the plan says what to cut, with the numbers that would fit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tunepilot.errors import InputError, Problem
from tunepilot.sizing.timing import PhaseSeconds

HOURS_PER_DAY = 24.0
PILOT_UPDATES = 1 + 3 + 1  # the pilot's first step, steady steps and accumulation update
PILOT_OVERFIT = (100, 8)  # its tiny-subset overfit: at most 100 updates of 8 examples
PILOT_LOADS = 3  # the base is loaded by the pilot, its resume gate and its export reload
# Float tolerance for "exactly at the margin" (hours): a plan at the boundary fits.
_TOLERANCE_H = 1e-9


@dataclass(frozen=True)
class PhaseHours:
    """One phase of the package: plain data a launcher can read (name, commands, hours)."""

    name: str
    hours: float
    sentence: str
    commands: tuple[str, ...] = ()


@dataclass(frozen=True)
class PackageFit:
    days: int
    hours_available: float
    usable_hours: float  # hours_available x (1 - margin)
    headroom: float  # share of the package the campaign leaves free
    fits: bool
    price: float | None
    cost_sentence: str


@dataclass(frozen=True)
class Workload:
    """The inputs of the arithmetic, kept together so cuts can change one field at a time."""

    seconds_per_update: float  # on the target
    updates_per_run: int
    n_variants: int
    n_seeds: int
    eval_seconds: float  # one full validation pass on the target
    evals_per_run: int
    checkpoint_seconds: float
    checkpoints_per_run: int
    export_seconds: float
    resume_rehearsal_seconds: float
    final_evals: int
    gpus: int
    repilot_seconds: float = 0.0
    commands: dict[str, tuple[str, ...]] = field(default_factory=dict)
    stack: str = ""  # what the re-pilot checks first on this card: backend, arch, versions

    @property
    def experiment_runs(self) -> int:
        """Variants x seeds, plus the control's other seeds (V6 compares seeds on both sides)."""
        return self.n_variants * self.n_seeds + (self.n_seeds - 1)

    @property
    def waves(self) -> int:
        """Experiment runs need no ordering among themselves: `gpus` of them run side by side."""
        return math.ceil(self.experiment_runs / self.gpus)

    def phases(self) -> list[PhaseHours]:
        run_s = self.updates_per_run * self.seconds_per_update
        run_s += self.checkpoints_per_run * self.checkpoint_seconds
        run_eval_s = self.evals_per_run * self.eval_seconds
        h = 3600.0
        side = f", {self.gpus} side by side" if self.gpus > 1 else ""
        looks = "look" if self.final_evals == 1 else "looks"
        rows = [
            ("re-pilot on this card", self.repilot_seconds / h,
             "every pilot gate again on the rented card and its software stack: start-up, "
             "memory per phase, resume, export (B1); its measured step replaces these hours"
             + (f"; stack to check and record (B2): {self.stack}" if self.stack else "")),
            ("initial control", (self.eval_seconds + run_s) / h,
             f"baseline evaluation of the starting model + 1 control run of "
             f"{self.updates_per_run} updates (H3)"),
            ("experiment", self.waves * run_s / h,
             f"{self.experiment_runs} runs ({self.n_variants} variants x {self.n_seeds} seeds + "
             f"{self.n_seeds - 1} more control seeds) in {self.waves} waves{side}"),
            ("evaluation",
             ((1 + self.waves) * run_eval_s + self.final_evals * self.eval_seconds) / h,
             f"{self.evals_per_run} validation passes per run (interleaved with training"
             f"{side}) + {self.final_evals} {looks} at the sealed test split by the chosen run "
             "(H4)"),
            ("resume rehearsal", self.resume_rehearsal_seconds / h,
             "reload a checkpoint in a new process and check step, learning rate, data (R1)"),
            ("export", self.export_seconds / h, "export, reload and replay control inputs (R2)"),
        ]  # fmt: skip
        return [PhaseHours(name, hours, what, self.commands.get(name, ()))
                for name, hours, what in rows]  # fmt: skip

    def total_hours(self) -> float:
        return sum(p.hours for p in self.phases())


@dataclass
class RentalPlan:
    """Hours per phase, every package's fit, the choice or what to cut (L3)."""

    target: str
    measured: bool  # False: computed from FLOPs and labelled assumptions
    basis: str  # where the seconds come from, in one sentence
    workload: Workload
    margin: float
    phases: list[PhaseHours]
    total_hours: float
    packages: list[PackageFit]
    chosen: PackageFit | None
    cuts: list[str] = field(default_factory=list)
    sentence: str = ""
    hours_range: tuple[float, float] = (0.0, 0.0)  # (low, high): the utilisation's range
    layout: str = "one GPU"  # how the machine runs the campaign

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _package(days: int, total_h: float, margin: float, price: float | None) -> PackageFit:
    available = days * HOURS_PER_DAY
    usable = available * (1.0 - margin)
    fits = total_h <= usable + _TOLERANCE_H
    if price is None:
        cost = f"fill in the price of the {days}-day package in the GPU catalog"
    else:
        cost = f"{price:,.2f} for {days} days"
    return PackageFit(days, available, usable, 1.0 - total_h / available, fits, price, cost)


def _cuts(work: Workload, budget_h: float, days: int) -> list[str]:
    """What to cut so the campaign fits `budget_h` hours, each with the numbers that fit."""

    def fits(w: Workload) -> bool:
        return w.total_hours() <= budget_h + _TOLERANCE_H

    where = f"the {days}-day package with its margin ({budget_h:.1f} h)"
    out: list[str] = []
    seeds = next((s for s in range(work.n_seeds - 1, 0, -1) if fits(replace(work, n_seeds=s))), 0)
    if seeds:
        out.append(f"fewer seeds: {seeds} instead of {work.n_seeds} fits {where}")
    variants = next(
        (v for v in range(work.n_variants - 1, -1, -1) if fits(replace(work, n_variants=v))), -1
    )
    if variants >= 0:
        out.append(f"fewer variants: {variants} instead of {work.n_variants} fits {where}")
    # Hours are linear in updates per run: solve for the largest count that fits.
    at0 = replace(work, updates_per_run=0).total_hours()
    per_update = replace(work, updates_per_run=1).total_hours() - at0
    updates = math.floor((budget_h - at0) / per_update) if per_update > 0 else 0
    if 1 <= updates < work.updates_per_run:
        out.append(
            f"fewer updates: {updates} per run instead of {work.updates_per_run} fits {where} "
            "(a different budget: record it, S7)"
        )
    more = next((g for g in range(work.gpus + 1, 65) if fits(replace(work, gpus=g))), None)
    if more is not None:
        out.append(f"more GPUs: a machine with {more} runs the variants side by side in {where}")
    if not out:
        out.append(
            f"nothing fits {where} even with one seed and no variant: shorten runs, measure "
            "on a faster card, or split the campaign"
        )
    return out


def plan_rental(
    seconds: PhaseSeconds,
    updates_per_run: int,
    n_variants: int,
    n_seeds: int,
    evals_per_run: int,
    *,
    gpus_in_package: int = 1,
    margin: float = 0.2,
    prices: dict[int, float | None] | None = None,
    checkpoints_per_run: int = 1,
    final_evals: int = 1,
    packages: tuple[int, ...] = (3, 7, 30),
    repilot_seconds: float = 0.0,
    commands: dict[str, tuple[str, ...]] | None = None,
    layout: str = "one GPU",
    stack: str = "",
) -> RentalPlan:
    """The plan for a campaign of `n_variants` variants (control excluded) x `n_seeds` seeds,
    from the seconds per update, validation pass, checkpoint, resume and export on the card;
    the package starts with the re-pilot on the card (`repilot_seconds`, B1) and looks at the
    sealed test once (`final_evals`, H4)."""
    problems = [
        Problem(f"plan.{k}", f"{v}", "use a number > 0")
        for k, v in (("seconds per update", seconds.update),)
        if not v > 0
    ]
    problems += [
        Problem(f"plan.{k}", f"{v}", f"use a whole number >= {low}")
        for k, v, low in (
            ("updates_per_run", updates_per_run, 1),
            ("n_variants", n_variants, 0),
            ("n_seeds", n_seeds, 1),
            ("evals_per_run", evals_per_run, 0),
            ("gpus_in_package", gpus_in_package, 1),
        )
        if v < low
    ]
    if not 0 <= margin < 1:
        problems.append(Problem("rental.margin", f"{margin}", "use a share in [0, 1), e.g. 0.2"))
    if problems:
        raise InputError(problems, title="cannot plan the rental")

    work = Workload(
        seconds.update, updates_per_run, n_variants, n_seeds, seconds.eval_pass, evals_per_run,
        seconds.checkpoint, checkpoints_per_run, seconds.export, seconds.resume, final_evals,
        gpus_in_package, repilot_seconds, dict(commands or {}), stack,
    )  # fmt: skip
    phases = work.phases()
    total = sum(p.hours for p in phases)
    fast, slow = seconds.spread
    ends = tuple(replace(work, seconds_per_update=work.seconds_per_update * f,
                         eval_seconds=work.eval_seconds * f,
                         repilot_seconds=work.repilot_seconds * f).total_hours()
                 for f in (fast, slow))  # fmt: skip
    price_of = prices or {}
    fits = [_package(d, total, margin, price_of.get(d)) for d in sorted(packages)]
    chosen = next((p for p in fits if p.fits), None)
    cuts: list[str] = []
    label = "measured" if seconds.measured else "computed"
    where = f"the {seconds.card}" + (f" ({layout})" if layout != "one GPU" else "")
    if not seconds.measured:
        where += f", {ends[0]:.1f}-{ends[1]:.1f} h with the utilisation's range"
    if chosen is not None:
        sentence = (
            f"The campaign needs {total:.1f} hours ({label}) on {where}; the "
            f"{chosen.days}-day package fits with {chosen.headroom:.0%} left free (margin asked "
            f"{margin:.0%}); cost: {chosen.cost_sentence}."
        )
    else:
        largest = max(packages)
        cuts = _cuts(work, largest * HOURS_PER_DAY * (1 - margin), largest)
        offered = ", ".join(str(d) for d in sorted(packages))
        sentence = (
            f"The campaign needs {total:.1f} hours ({label}) on {where}: no package "
            f"of {offered} days fits with a {margin:.0%} margin. Cut one of: "
            + "; ".join(cuts) + "."
        )  # fmt: skip
    return RentalPlan(seconds.card, seconds.measured, seconds.basis, work, margin, phases, total,
                      fits, chosen, cuts, sentence, ends, layout)  # fmt: skip


def repilot_seconds(seconds: PhaseSeconds, examples_per_update: int, eval_batches: int) -> float:
    """The pilot's gates on the rented card: the base loaded three times (pilot, resume in a
    new process, export reload), a handful of updates, the tiny-subset overfit (at most 100
    updates of 8 examples), one validation batch, a checkpoint and an export."""
    load = seconds.resume - seconds.update  # one load of the base and its checkpoint
    updates, (overfit, examples) = PILOT_UPDATES, PILOT_OVERFIT
    overfit_s = overfit * seconds.update * min(1.0, examples / max(1, examples_per_update))
    return (PILOT_LOADS * load + updates * seconds.update + overfit_s
            + seconds.eval_pass / max(1, eval_batches) + seconds.checkpoint
            + seconds.export)  # fmt: skip


def plan_markdown(plan: RentalPlan) -> str:
    """`pilots/<id>/plan.md`: the phases, the packages and the decision, for a person."""
    how = "measured" if plan.measured else "computed"
    lines = [
        f"# Rental plan on the {plan.target} (L3)",
        "",
        f"Basis: {plan.basis}.",
        f"One update takes {plan.workload.seconds_per_update:.3g} s ({how}); the machine runs "
        f"the campaign as {plan.layout}; margin kept free: {plan.margin:.0%}.",
        "",
        f"| phase | hours ({how}) | what | commands |",
        "|---|---:|---|---|",
    ]
    lines += [f"| {p.name} | {p.hours:.2f} | {p.sentence} | "
              f"{'; '.join(f'`{c}`' for c in p.commands)} |" for p in plan.phases]  # fmt: skip
    low, high = plan.hours_range
    spread = f" ({low:.2f}-{high:.2f} with the utilisation's range)" if not plan.measured else ""
    lines += [f"| **total** | **{plan.total_hours:.2f}**{spread} | | |", ""]
    lines += [
        "| package | hours | usable with margin | left free | fits | cost |",
        "|---|---:|---:|---:|---|---|",
    ]
    for p in plan.packages:
        mark = "yes" if p.fits else "no"
        free = (
            f"{p.headroom:.0%}"
            if p.headroom >= 0
            else f"over by {plan.total_hours - p.hours_available:.1f} h"
        )
        lines.append(
            f"| {p.days} days | {p.hours_available:.0f} | {p.usable_hours:.1f} | "
            f"{free} | {mark} | {p.cost_sentence} |"
        )
    lines += ["", f"**Decision:** {plan.sentence}"]
    if plan.cuts:
        lines += ["", "What to cut (one of):"] + [f"- {c}" for c in plan.cuts]
    return "\n".join(lines) + "\n"
