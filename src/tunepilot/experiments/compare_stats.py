"""The paired bootstrap behind `compare` (V6): is a variant's gain larger than the noise?

A headline metric such as macro-F1 is not a mean of per-example scores, so resampling per-example
0/1 scores would bound the wrong number. Instead each example contributes a few columns (per
class: true positive, predicted, gold; per field: token F1, gold has it) whose column sums give
the metric back exactly; a resample is a vector of example weights, so one matrix product per
chunk of resamples gives the metric of every resample. Paired: the control and the variant are
weighed with the same resample of examples, so example difficulty cancels out. numpy only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RESAMPLES, LEVEL = 2000, 0.95
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
    if task == "classification" and all("gold" in r and "pred" in r for r in rows):
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


def pooled(scorer: Scorer, runs: list[dict[str, Any]], ids: list[str]) -> Any:
    """(examples, columns): each example's contributions averaged over the runs (seeds)."""
    import numpy as np

    return np.mean([[scorer.contributions(run[i]) for i in ids] for run in runs], axis=0)


def paired_bootstrap(
    control: Any, variant: Any, value: Callable[[Any], Any], resamples: int = RESAMPLES,
    seed: int = 0, level: float = LEVEL,
) -> tuple[float, float, float]:  # fmt: skip
    """(point difference, low, high): percentile interval of value(variant) - value(control)
    over `resamples` resamples of the examples, the same resample for both sides."""
    import numpy as np

    n = control.shape[0]
    rng = np.random.default_rng(seed)
    ones = np.ones((1, n))
    point = float((value(ones @ variant) - value(ones @ control))[0])
    uniform, diffs = np.full(n, 1.0 / n), []
    for start in range(0, resamples, CHUNK):
        w = rng.multinomial(n, uniform, size=min(CHUNK, resamples - start)).astype(float)
        diffs.append(value(w @ variant) - value(w @ control))
    tail = (1 - level) / 2
    low, high = np.quantile(np.concatenate(diffs), [tail, 1 - tail])
    return point, float(low), float(high)
