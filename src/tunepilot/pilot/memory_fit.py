"""The pilot's memory fit (S1, S5): peaks measured on this machine at a few (microbatch,
length) points, fitted as peak = fixed + a x tokens + b x tokens x length (tokens = microbatch
x length; the quadratic term is attention scores), and checked on a held-out point before
anyone trusts it.

Two ways of predicting memory answer two questions. The dry run (`sizing/dry_run/`) answers
"what will this step need on a card I do not have?": it executes the step on fake tensors for
any card, shape and option, and every per-card number in the plan is its. This fit answers
"does what this machine really allocates grow the way we think?": it is measured with the real
kernels and allocator of the machine the pilot ran on, so on the rented card (the re-pilot,
B1) it is the evidence the dry run is held to. It never sizes another card.

Pure Python + numpy; the measurements come from the one memory probe.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tunepilot.errors import input_error
from tunepilot.measure.memory import MemoryProbe, human_bytes
from tunepilot.verdict import Verdict

Point = tuple[int, int, float]  # (microbatch, length, peak bytes)


@dataclass
class MemoryModel:
    """peak = fixed + a x (mb x len) + b x (mb x len^2), coefficients >= 0."""

    fixed: float
    per_token: float  # a
    per_token_length: float  # b
    points: list[Point] = field(default_factory=list)
    identifiable: bool = True  # False when the grid cannot separate the terms
    max_fit_error: float = 0.0  # largest relative residual on the fitted points

    def activation_bytes(self, microbatch: int, length: int) -> float:
        tokens = microbatch * length
        return self.per_token * tokens + self.per_token_length * tokens * length

    def predict(self, microbatch: int, length: int) -> float:
        return self.fixed + self.activation_bytes(microbatch, length)

    def sentence(self) -> str:
        return (
            f"peak = {human_bytes(self.fixed)} + {self.per_token:.0f} B x tokens + "
            f"{self.per_token_length:.3g} B x tokens x length, fitted on {len(self.points)} "
            f"points (largest residual {self.max_fit_error:.1%})"
            + ("" if self.identifiable else "; the grid cannot separate the terms: vary length")
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "sentence": self.sentence()}


def fit_memory_model(points: Sequence[Point]) -> MemoryModel:
    """Non-negative least squares, exact: with three terms every subset of columns is tried
    and the best feasible one kept (the NNLS optimum is the plain least-squares solution on
    its own support), so no scipy is needed. Columns are scaled for conditioning."""
    if len(points) < 2:
        raise input_error("plan.grid", f"{len(points)} measured point(s)", "measure at least 3")
    pts = [(int(mb), int(n), float(p)) for mb, n, p in points]
    design = np.array([[1.0, mb * n, mb * n * n] for mb, n, _ in pts])
    target = np.array([p for _, _, p in pts])
    scale = np.abs(design).max(axis=0)
    scaled = design / scale
    best: tuple[float, np.ndarray] | None = None
    for k in range(1, 4):
        for cols in itertools.combinations(range(3), k):
            coef, *_ = np.linalg.lstsq(scaled[:, cols], target, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(3)
            full[list(cols)] = coef
            residual = float(np.sum((scaled @ full - target) ** 2))
            if best is None or residual < best[0] - 1e-12 * max(1.0, residual):
                best = (residual, full)
    if best is None:  # only when every target is negative: nothing sensible to fit
        raise input_error("plan.grid", "negative peaks", "measure absolute peaks, not deltas")
    fixed, a, b = (best[1] / scale).tolist()
    model = MemoryModel(fixed, a, b, pts, identifiable=bool(np.linalg.matrix_rank(scaled) == 3))
    rel = [abs(model.predict(mb, n) - p) / p for mb, n, p in pts if p > 0]
    model.max_fit_error = max(rel, default=0.0)
    return model


CANNOT_VALIDATE = "cannot validate"
NOISE_FLOOR_SHARE = 0.01
"""Peaks that move by less than this share of the largest one across the whole grid show no
activation part: on CPU RSS the allocator's reuse and page rounding are of that order."""


@dataclass(frozen=True)
class HoldoutCheck:
    """The memory model fitted without one grid point, then asked to predict it.

    The verdict is on the activation part (the measured peak minus the fitted fixed part): it
    is what decides the microbatch, and an error on the whole peak hides in a large fixed
    part. When the grid shows no activation part above the noise floor, nothing can show an
    error: the verdict is "cannot validate", never PASS.
    """

    microbatch: int
    length: int
    measured: float
    predicted: float
    relative_error: float  # |predicted - measured| / measured peak (for reference)
    activation_error: float  # the same error over the measured activation part: the verdict's
    goal: float
    verdict: Verdict | None  # None: cannot validate
    sentence: str

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = str(self.verdict) if self.verdict is not None else CANNOT_VALIDATE
        return out


def holdout_error(
    points: Sequence[Point], holdout: int | tuple[int, int] = -1, goal: float = 0.10
) -> HoldoutCheck:
    """Fit on every point but `holdout` (an index or a (microbatch, length)) and predict it;
    judged on the activation part, or "cannot validate" when the grid cannot show one."""
    if isinstance(holdout, tuple):
        idx = [i for i, (mb, n, _) in enumerate(points) if (mb, n) == holdout]
        if not idx:
            raise input_error("plan.holdout", f"{holdout} was not measured", "pick a grid point")
        index = idx[0]
    else:
        index = holdout % len(points)
    mb, n, measured = points[index]
    model = fit_memory_model([p for i, p in enumerate(points) if i != index])
    predicted = model.predict(mb, n)
    err = abs(predicted - measured) / measured if measured > 0 else math.inf
    peaks = [p for _, _, p in points]
    spread, floor = max(peaks) - min(peaks), NOISE_FLOOR_SHARE * max(peaks)
    part = measured - model.fixed
    at = f"microbatch {mb} x length {n}"
    flat = model.per_token == 0 and model.per_token_length == 0
    if spread <= floor or part <= floor or flat:
        sentence = (
            f"{CANNOT_VALIDATE}: across the grid the peaks move by {human_bytes(spread)} (noise "
            f"floor {human_bytes(floor)}, {NOISE_FLOOR_SHARE:.0%} of the largest), so the "
            f"activation part at {at} is invisible to this counter and no held-out point can "
            "show an error; measure tensor bytes (`--tensors`) or larger shapes"
        )
        return HoldoutCheck(mb, n, measured, predicted, err, math.nan, goal, None, sentence)
    act = abs(predicted - measured) / part
    verdict = Verdict.PASS if act <= goal else Verdict.WARN
    sentence = (
        f"fitted on {len(points) - 1} points, the model predicts {human_bytes(predicted)} at {at} "
        f"where {human_bytes(measured)} was measured: error {act:.1%} of the activation part "
        f"({human_bytes(part)}; goal <= {goal:.0%}), {err:.1%} of the whole peak"
    )
    if verdict is Verdict.WARN:
        sentence += "; measure more grid points before trusting the fit"
    return HoldoutCheck(mb, n, measured, predicted, err, act, goal, verdict, sentence)


def measure_memory_grid(
    run_step: Callable[[int, int], Any],
    grid: Sequence[tuple[int, int]],
    probe: MemoryProbe,
    counter: str | None = None,
    warmup: bool = True,
) -> list[Point]:
    """Absolute peaks of `run_step(microbatch, length)` at each grid point.

    Smallest shapes first: freed heap stays resident on CPU, so a large shape measured
    before a small one would inflate the small one's peak. One unmeasured warm-up step first
    allocates the optimizer state, so every point sees the steady fixed part (S4).
    `counter` defaults to `reserved` on a GPU (what the card must hold) and `rss` on CPU.
    """
    name = counter or ("rss" if probe.counters.kind == "cpu" else "reserved")
    ordered = sorted(grid, key=lambda s: (s[0] * s[1], s[1]))
    if warmup and ordered:
        run_step(*ordered[0])
    points: list[Point] = []
    for mb, n in ordered:
        with probe.phase(f"grid mb={mb} len={n}") as record:
            run_step(mb, n)
        peak = record.peak_bytes(name)
        if peak is None:
            raise input_error("plan.counter", f"no `{name}` reading", f"use {record.counters}")
        points.append((mb, n, float(peak)))
    return points
