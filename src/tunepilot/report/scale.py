"""Which runs the dossier shows in full, so it stays one readable file at thousands of runs.

A campaign of a few dozen runs shows every run: its row, its loss curve, its validation points.
At 5,000 runs that was 14 MB of HTML and 36 CPU-seconds, a page nobody could read. Above
`FULL_RUNS` runs the dossier shows the chosen variants in full (the control and the adopted
variant, else the one with the largest difference to the control: the configurations the
decision is about), at most `FULL_RUNS` of their runs, the latest first kept; every variant
gets one summary row (runs by status, seeds, the final metric's mean and spread, the runs
that ended badly), and `tunepilot runs` lists every run. The ledger keeps them all (V3).
"""

from __future__ import annotations

from typing import Any

FULL_RUNS = 100


def best_variant(cmp: dict[str, Any] | None, among: Any = None) -> str | None:
    """The variant with the largest difference to the control (its interval's point), of
    those in `among` when given; None without a comparison or an interval."""
    scored = [(v["ci"].get("diff", 0.0), v["name"]) for v in (cmp or {}).get("variants") or []
              if v.get("name") not in (None, "control") and isinstance(v.get("ci"), dict)
              and (among is None or v["name"] in among)]  # fmt: skip
    return max(scored)[1] if scored else None


def chosen_variants(cmp: dict[str, Any] | None) -> list[str]:
    """The control, and the adopted variant (else the best one): what the decision is about."""
    other = (cmp or {}).get("adopted") or best_variant(cmp)
    return ["control", *([other] if other and other != "control" else [])]


def shown_in_full(runs: list[Any], cmp: dict[str, Any] | None) -> set[str]:
    """The ids of the runs (ledger rows, in registration order) the dossier shows in full."""
    if len(runs) <= FULL_RUNS:
        return {r.id for r in runs}
    chosen = set(chosen_variants(cmp))
    picked = [r.id for r in runs if r.variant in chosen]
    return set(picked[-FULL_RUNS:])
