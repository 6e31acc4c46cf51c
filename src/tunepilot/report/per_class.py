"""The per-class (per-field) series of the dossier: the baseline, the control and the best
variant side by side (H2, H3), each variant as the mean over its compared seeds."""

from __future__ import annotations

import statistics
from typing import Any

from tunepilot.data.workspace import Workspace


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
        used = [r.get("metrics") or {} for r in v.get("runs") or [] if r.get("excluded") is None]
        blocks = [m.get(block) for m in used if isinstance(m.get(block), dict)]
        if blocks and v.get("name"):
            names = list(dict.fromkeys(k for blk in blocks for k in blk))
            means[v["name"]] = {
                n: statistics.fmean(blk[n][metric] for blk in blocks if metric in blk.get(n, {}))
                for n in names
                if any(metric in blk.get(n, {}) for blk in blocks)
            }
    best = cmp.get("adopted") or _best_variant(cmp, means)
    for name, role in (("control", "control"), (best, "best variant")):
        if name in means:
            out["series"].append({"name": name, "role": role, "values": means[name]})
    return out


def _best_variant(cmp: dict[str, Any], means: dict[str, Any]) -> str | None:
    """No adopted variant: the one with the largest difference to the control, if any."""
    scored = [(v["ci"].get("diff", 0.0), v["name"]) for v in cmp.get("variants") or []
              if v.get("name") not in (None, "control") and isinstance(v.get("ci"), dict)
              and v["name"] in means]  # fmt: skip
    return max(scored)[1] if scored else None
