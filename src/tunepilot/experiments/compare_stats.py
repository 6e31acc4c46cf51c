"""The statistics behind `compare` (V6): is a variant's gain larger than the noise?

Two sources of noise decide whether a gain is real: which examples the validation split holds,
and which seed a run drew (initialisation, data order, dropout). The bootstrap here resamples
both, hierarchically: each resample draws seeds with replacement from the seeds the control and
the variant share, and examples with replacement from the examples they share; the control and
the variant get the same draw (paired), so example difficulty and the seed's data order cancel
out. Pooling the seeds first and resampling only examples would leave seed-to-seed variance
out of the interval, and with one seed there is none to measure.

A headline metric such as macro-F1 is not a mean of per-example scores, so resampling per-example
0/1 scores would bound the wrong number. Instead each example contributes a few columns (per
class: true positive, predicted, gold; per field: token F1, gold has it) whose column sums give
the metric back exactly; a resample is a vector of seed counts and one of example weights, so a
few matrix products per chunk of resamples give the metric of every resample. numpy only.

Several variants tested against one control are several chances of a lucky interval: `holm`
adjusts their one-sided p-values (Holm's step-down, which controls the family-wise error).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunepilot.campaign import CLASSIFICATION_TASKS

RESAMPLES, LEVEL = 2000, 0.95
BOOTSTRAP_SEED = 0  # the resampling is seeded: the same evidence gives the same interval
CHUNK = 250  # resamples per matrix product: bounds memory at CHUNK x examples weights


@dataclass
class Scorer:
    """Per-example contributions whose (weighted) column sums give the metric back."""

    metric: str
    contributions: Callable[[Any], list[float]]
    value: Callable[[Any], Any]  # (resamples, columns) sums -> (resamples,) metric


def make_scorer(task: str, predictions: list[Any]) -> Scorer:
    """The headline metric as a function of summed per-example contributions.

    classification: per class (tp, predicted, gold) -> macro-F1 over classes seen, exactly as
    classification_metrics computes it; extraction: per field (token F1, gold has it) ->
    field_token_f1_macro; format: token F1; anything else: the mean of Prediction.score.
    """
    import numpy as np

    rows = [p.row or {} for p in predictions]
    if task in CLASSIFICATION_TASKS and all("gold" in r and "pred" in r for r in rows):
        names = sorted({str(r[k]) for r in rows for k in ("gold", "pred")})

        def cls(p: Any) -> list[float]:
            g, q = str(p.row["gold"]), str(p.row["pred"])
            return [x for n in names for x in (float(g == n == q), float(q == n), float(g == n))]

        def macro_f1(s: Any) -> Any:
            tp, npred, ngold = s[:, 0::3], s[:, 1::3], s[:, 2::3]
            with np.errstate(divide="ignore", invalid="ignore"):
                f1 = np.where(npred + ngold > 0, 2 * tp / (npred + ngold), 0.0)
            seen = (npred + ngold) > 0
            return (f1 * seen).sum(axis=1) / np.maximum(seen.sum(axis=1), 1)

        return Scorer("macro_f1", cls, macro_f1)
    if task == "extraction" and all(isinstance(r.get("fields"), dict) for r in rows):
        fields = sorted({f for r in rows for f in r["fields"]})

        def ext(p: Any) -> list[float]:
            got = p.row["fields"]
            return [x for f in fields for x in
                    ((float(got[f]["token_f1"]), 1.0) if f in got else (0.0, 0.0))]  # fmt: skip

        def field_macro(s: Any) -> Any:
            tf1, has = s[:, 0::2], s[:, 1::2]
            per = np.where(has > 0, tf1 / np.maximum(has, 1e-12), 0.0)
            return (per * (has > 0)).sum(axis=1) / np.maximum((has > 0).sum(axis=1), 1)

        return Scorer("field_token_f1_macro", ext, field_macro)
    key = "token_f1" if task == "format" and all("token_f1" in r for r in rows) else None

    def mean(p: Any) -> list[float]:
        value = p.row[key] if key else p.score
        return [float(value if value is not None else 0.0), 1.0]

    return Scorer(key or "score", mean, lambda s: s[:, 0] / np.maximum(s[:, 1], 1e-12))


def stacked(scorer: Scorer, runs: list[dict[str, Any]], ids: list[str]) -> Any:
    """(seeds, examples, columns): each run's per-example contributions, seed by seed."""
    import numpy as np

    return np.array([[scorer.contributions(run[i]) for i in ids] for run in runs], dtype=float)


@dataclass(frozen=True)
class Interval:
    """value(variant) - value(control): the point estimate, its percentile interval, and the
    one-sided bootstrap p-value of "no gain" (the share of resamples whose difference <= 0)."""

    diff: float
    low: float
    high: float
    p_value: float


def hierarchical_bootstrap(
    control: Any, variant: Any, value: Callable[[Any], Any], resamples: int = RESAMPLES,
    seed: int = 0, level: float = LEVEL,
) -> Interval:  # fmt: skip
    """The paired, two-level bootstrap of value(variant) - value(control).

    `control` and `variant` are (seeds, examples, columns), seed j of one paired with seed j of
    the other. Each resample draws seed counts (multinomial over the seeds) and example weights
    (multinomial over the examples); a side's statistic is value(sum over seeds of count x
    weights @ contributions). Seeded: the same inputs and `seed` give the same interval.
    """
    import numpy as np

    k, n = control.shape[0], control.shape[1]
    rng = np.random.default_rng(seed)
    ones = np.ones((1, n))
    point = float((value(ones @ variant.sum(axis=0)) - value(ones @ control.sum(axis=0)))[0])
    diffs = []
    for start in range(0, resamples, CHUNK):
        b = min(CHUNK, resamples - start)
        seeds = rng.multinomial(k, np.full(k, 1.0 / k), size=b).astype(float)  # (b, k)
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=b).astype(float)  # (b, n)
        sides = [np.einsum("bk,kbc->bc", seeds, np.stack([weights @ x for x in side]))
                 for side in (control, variant)]  # fmt: skip
        diffs.append(value(sides[1]) - value(sides[0]))
    every = np.concatenate(diffs)
    tail = (1 - level) / 2
    low, high = np.quantile(every, [tail, 1 - tail])
    p_value = float((1 + np.count_nonzero(every <= 0)) / (every.size + 1))
    return Interval(point, float(low), float(high), p_value)


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values: the i-th smallest of m is multiplied by (m - i + 1), kept
    monotone and capped at 1. A variant whose adjusted p-value is below alpha is a finding
    with the family-wise error of all the variants held at alpha."""
    ordered = sorted(p_values.items(), key=lambda kv: kv[1])
    m, running, out = len(ordered), 0.0, {}
    for i, (name, p) in enumerate(ordered):
        running = max(running, min(1.0, (m - i) * p))
        out[name] = running
    return out


def interval(
    contributions: Any, value: Callable[[Any], Any], resamples: int = RESAMPLES, seed: int = 0,
    level: float = LEVEL,
) -> tuple[float, float, float]:  # fmt: skip
    """(point, low, high): one run's metric on (examples, columns) contributions, with its
    percentile bootstrap interval over resamples of the examples (a model card's spread)."""
    import numpy as np

    n = contributions.shape[0]
    rng = np.random.default_rng(seed)
    point = float(value(np.ones((1, n)) @ contributions)[0])
    draws = (rng.multinomial(n, np.full(n, 1.0 / n), size=min(CHUNK, resamples - start))
             for start in range(0, resamples, CHUNK))  # example weights, a chunk at a time
    values = [value(w.astype(float) @ contributions) for w in draws]
    low, high = np.quantile(np.concatenate(values), [(1 - level) / 2, (1 + level) / 2])
    return point, float(low), float(high)
