"""The per-class (per-field) series of the dossier: the baseline, the control and the best
variant side by side (H2, H3), each variant as the mean over its compared seeds."""

from __future__ import annotations

import statistics
from typing import Any

from tunepilot.data.workspace import Workspace
from tunepilot.report.scale import best_variant


def per_class_series(
    ws: Workspace, baseline: dict[str, Any], cmp: dict[str, Any] | None
) -> dict[str, Any]:
    """Per class (per field) scores of the baseline, the control and the best variant: the
    seed mean of each variant's compared runs (comparison.json), the baseline's last one."""
    if ws.campaign.hypothesis.is_classification:
        block, metric = "per_class", ws.campaign.hypothesis.classification_guards.metric
    else:
        block, metric = "per_field", "token_f1"
    out: dict[str, Any] = {"block": block, "metric": metric, "series": [], "support": {}}
    base_evals = [e for e in baseline["evaluations"] if e["split"] == "validation" and e.get(block)]
    if base_evals:
        b = base_evals[-1][block]
        out["series"].append({"name": "baseline", "role": "baseline",
                              "values": {k: v.get(metric) for k, v in b.items()}})  # fmt: skip
        out["support"] = {k: v.get("support") for k, v in b.items() if "support" in v}
    if not cmp:
        return out
    means: dict[str, dict[str, float]] = {}
    for v in cmp.get("variants") or []:
        mean = (v.get("mean") or {}).get(block)  # the seed mean compare wrote
        if isinstance(mean, dict) and mean and v.get("name"):
            means[v["name"]] = {n: m[metric] for n, m in mean.items()
                                if isinstance(m, dict) and metric in m}  # fmt: skip
            continue
        # a comparison.json written before the seed mean was kept: every run's own block
        used = [r.get("metrics") or {} for r in v.get("runs") or [] if r.get("excluded") is None]
        blocks = [m.get(block) for m in used if isinstance(m.get(block), dict)]
        if blocks and v.get("name"):
            names = list(dict.fromkeys(k for blk in blocks for k in blk))
            means[v["name"]] = {
                n: statistics.fmean(blk[n][metric] for blk in blocks if metric in blk.get(n, {}))
                for n in names
                if any(metric in blk.get(n, {}) for blk in blocks)
            }
    best = cmp.get("adopted") or best_variant(cmp, among=means)
    for name, role in (("control", "control"), (best, "best variant")):
        if name in means:
            out["series"].append({"name": name, "role": role, "values": means[name]})
    return out
