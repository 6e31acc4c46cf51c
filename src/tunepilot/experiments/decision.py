"""The decision at the end of `compare` (V6, V7): adopt one variant, or keep the control.

The rule, in full:
- a variant is adopted only when every guard passes (H2), nothing blocks it (an unfinished
  seed, no seed in common with the control), and its gain over the control is a finding: the
  one-sided p-value of its paired hierarchical bootstrap, Holm-adjusted across every variant
  that got an interval, is below (1 - LEVEL) / 2. With one variant that is the same as its
  LEVEL interval lying above 0;
- and the evidence spans at least MIN_SEEDS seeds run by both the variant and the control. One
  seed cannot show seed-to-seed variance, so a gain on one seed is reported as such ("rests on
  one seed") and the control stays until more seeds are run;
- among several adoptable variants, the largest point gain wins; the others are named;
- otherwise the control stays, a valid and re-readable conclusion (V7), with every variant's
  reason.

`compare` exits 1 when the configuration it ends on fails one of its own guards (the kept
control, or nothing passes), 0 otherwise: one rule for outcomes, documented in the README.
"""

from __future__ import annotations

import math
from typing import Any

from tunepilot.experiments.compare_stats import LEVEL, holm
from tunepilot.verdict import Verdict

MIN_SEEDS = 2
ALPHA = (1 - LEVEL) / 2  # one-sided: the same bar as a LEVEL interval lying above 0


def adjust_for_multiplicity(variants: list[Any]) -> None:
    """Holm across every variant that got an interval: ci["p_holm"] and ci["compared"]."""
    with_ci = {v.name: v for v in variants if v.ci is not None}
    adjusted = holm({name: v.ci["p_value"] for name, v in with_ci.items()})
    for name, v in with_ci.items():
        v.ci["p_holm"] = adjusted[name]
        v.ci["compared"] = len(with_ci)


def _evidence(ci: dict[str, Any]) -> str:
    seeds = ci["seeds"]
    spread = f"seeds {seeds}" if len(seeds) > 1 else f"one seed ({seeds[0]})"
    return (f"{ci['metric']} {ci['diff']:+.4f} over the control ({LEVEL:.0%} CI {ci['low']:+.4f} "
            f"to {ci['high']:+.4f}; {spread}, {ci['n_examples']} examples, {ci['resamples']} "
            f"resamples of seeds and examples; Holm-adjusted p {ci['p_holm']:.4f} across "
            f"{ci['compared']} variant(s))")  # fmt: skip


def decide(cmp: Any) -> None:
    """Set cmp.adopted and cmp.decision by the rule in this module's docstring."""
    adjust_for_multiplicity(cmp.variants[1:])
    eligible: list[Any] = []
    reasons: list[str] = []
    one_seed: list[str] = []
    for v in cmp.variants[1:]:
        failing = [f for f in v.guards if f.verdict is Verdict.FAIL]
        why = list(v.blocked)
        ci = v.ci
        if not v.used:
            why = [f"no comparable completed run ({status_words(v)})"]
        elif ci is not None and ci["p_holm"] >= ALPHA:
            why.append(f"its gain is not a finding: {_evidence(ci)}")
        elif ci is not None and len(ci["seeds"]) < MIN_SEEDS:
            why.append(f"the evidence rests on one seed: {_evidence(ci)}; one seed cannot show "
                       "seed-to-seed variance (V6)")  # fmt: skip
            if not failing and not v.blocked:
                one_seed.append(v.name)
        why += [f"fails {f.check} ({f.sentence})" for f in failing]
        if why:
            reasons.append(f"`{v.name}`: " + "; ".join(why))
        else:
            eligible.append(v)
    if eligible:
        best = max(eligible, key=lambda v: v.ci["diff"] if v.ci else -math.inf)
        cmp.adopted = best.name
        others = [v.name for v in eligible if v is not best]
        cmp.decision = (
            f"Adopt `{best.name}`: {_evidence(best.ci or {})} and every guard passes"
            + (f"; also eligible: {', '.join(others)}" if others else "")
            + "."
        )
        return
    if len(cmp.variants) == 1:
        reasons.append("no variant has been run")
    control_fails = [f.check for f in cmp.variants[0].guards if f.verdict is Verdict.FAIL]
    more_seeds = (
        f" Before adopting {', '.join(f'`{n}`' for n in one_seed)}, run at least {MIN_SEEDS} "
        "seeds of it and of the control (`tunepilot run --seeds 0,1,2`) and compare again."
        if one_seed else "")  # fmt: skip
    cmp.decision = (
        "Keep the control: " + "; ".join(reasons) + ". Keeping the control is a valid, "
        "re-readable conclusion (V7)." + more_seeds
        + (f" Note: the control itself fails {', '.join(control_fails)}; read its guards "
           "before relying on it (the starting model may be the better choice)."
           if control_fails else "")
    )  # fmt: skip


def status_words(v: Any) -> str:
    return "; ".join(f"{x.run_id} {x.excluded}" for x in v.runs) or "never run"
