"""Guards: what must not degrade while the headline metric goes up (H2).

A variant that lifts macro-F1 by sinking one class is not an improvement for the people whose
tickets land in that class, and a mean hides exactly that. So classification guards are judged
*per class* (every failing class is named with its numbers), against fixed floors and against
two references: the starting model (baseline, H3) and the control. Extraction and format guards
are rates a user can read: JSON that parses, JSON that matches the schema, required fields that
are present.

Input is the metrics dict `evaluate()` produces (tasks/metrics.py); nothing here needs a model.

The baseline is a reference for a class only where it knows something about that class
(H3): a head that is new (randomly initialised, not in the checkpoint) answers by chance, and
a class on which the starting model does no better than always answering the split's
majority class (its bootstrap interval reaching down to that predictor's score) has nothing
to lose. `baseline_reference` records both at baseline time; the vs-baseline guard judges the
other classes only, and says which it left out and why. The control is always a reference.
"""

from __future__ import annotations

from typing import Any

from tunepilot.campaign import Campaign
from tunepilot.campaign.variants import CONTROL
from tunepilot.experiments.compare_stats import CHUNK, LEVEL
from tunepilot.verdict import Finding, Verdict

EPS = 1e-9  # a drop exactly at the tolerance is allowed; float noise must not fail a guard

# (metrics key, ExtractionGuards attribute, words for the sentence)
RATE_GUARDS = (
    ("json_validity", "json_validity_min", "outputs parse as a JSON object"),
    ("schema_validity", "schema_validity_min", "outputs match the target schema"),
    ("required_field_presence", "required_field_presence_min", "outputs carry all required fields"),
)


def check_guards(
    campaign: Campaign,
    metrics: dict[str, Any],
    baseline_metrics: dict[str, Any] | None,
    control_metrics: dict[str, Any] | None,
) -> list[Finding]:
    """Every guard of the campaign's hypothesis on `metrics`, one Finding per guard (H2).

    Classification is judged per class, never only on the mean; generation on its format
    rates (`format_guards`). `baseline_metrics` / `control_metrics` are the references a class
    may not drop below by more than `max_class_drop`; pass None when there is none (judging the
    control itself, or no comparable baseline): the vs-baseline guard then WARNs that it could
    not be judged, the vs-control guard is simply not part of the list.
    """
    if not campaign.hypothesis.is_classification:
        return format_guards(campaign, metrics)
    g = campaign.hypothesis.classification_guards
    per_class = _per_class(metrics, g.metric)
    findings = [_floors(per_class, g.metric, g.per_class_floor, g.class_floors)]
    if baseline_metrics is None:
        findings.append(
            Finding(
                "guard: class drop vs baseline",
                Verdict.WARN,
                "not judged: no comparable baseline evaluation; run `tunepilot baseline` so "
                "every class is checked against the starting model (H3)",
                "H2, H3",
            )
        )
    else:
        findings.append(_baseline_drops(per_class, baseline_metrics, g.metric, g.max_class_drop))
    if control_metrics is not None:
        findings.append(
            _drops(per_class, _per_class(control_metrics, g.metric), g.metric,
                   g.max_class_drop, "control")
        )  # fmt: skip
    return findings


REFERENCE_RESAMPLES = 1000  # bootstrap draws behind the baseline's per-class lower bounds


def baseline_reference(rows: list[dict[str, Any]], new_weights: list[str]) -> dict[str, Any]:
    """What a classification baseline can be a reference for (H3), from its predictions:
    `new_weights` (not in the checkpoint: a random head when they are the classifier's), and
    per guard metric and class the lower end of the baseline's LEVEL bootstrap interval next
    to the score of always answering the split's majority class."""
    import numpy as np

    gold = [str(r["gold"]) for r in rows]
    pred = [str(r["pred"]) for r in rows]
    names = sorted(set(gold) | set(pred))
    majority = max(sorted(set(gold)), key=gold.count) if gold else None
    share = gold.count(majority) / len(gold) if gold else 0.0
    always = {"f1": 2 * share / (1 + share), "precision": share, "recall": 1.0}
    # one draw of example weights for every class and metric (chunks bound the memory)
    cols = np.array([[[g == p == n, p == n, g == n] for n in names]
                     for g, p in zip(gold, pred, strict=True)], dtype=float)  # (n, K, 3)
    rng, sums = np.random.default_rng(0), []
    for start in range(0, REFERENCE_RESAMPLES, CHUNK):
        size = min(CHUNK, REFERENCE_RESAMPLES - start)
        weights = rng.multinomial(len(gold), np.full(len(gold), 1 / len(gold)), size=size)
        sums.append(np.einsum("rn,nkc->rkc", weights.astype(float), cols))
    tp, npred, ngold = np.moveaxis(np.concatenate(sums), 2, 0)  # each (resamples, K)
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = {"f1": np.where(npred + ngold > 0, 2 * tp / (npred + ngold), 0.0),
                  "precision": np.where(npred > 0, tp / npred, 0.0),
                  "recall": np.where(ngold > 0, tp / ngold, 0.0)}  # fmt: skip
    tail = (1 - LEVEL) / 2
    low = {m: {n: round(float(v), 4) for n, v in zip(names, np.quantile(x, tail, axis=0),
                                                     strict=True)}
           for m, x in scores.items()}  # fmt: skip
    return {
        "new_weights": list(new_weights),
        "majority_class": majority,
        "majority_scores": {m: ({majority: round(v, 4)} if majority else {})
                            for m, v in always.items()},
        "low": low,
        "level": LEVEL,
    }  # fmt: skip


def _baseline_drops(
    per_class: dict[str, tuple[float, int]],
    baseline: dict[str, Any],
    metric: str,
    tolerance: float,
) -> Finding:
    """Class drops vs the baseline, on the classes where the baseline is a reference (see the
    module docstring); the rest are named as not judged, with the reason."""
    check = "guard: class drop vs baseline"
    reference = _per_class(baseline, metric)
    ref = baseline.get("reference") if isinstance(baseline.get("reference"), dict) else None
    if ref is None:  # recorded before the reference was kept: every class is judged
        return _drops(per_class, reference, metric, tolerance, "baseline")
    note = baseline_note(baseline)
    if note:
        sentence = (f"not judged: {note}; every class is held to its floor, and a variant to "
                    "the control")  # fmt: skip
        return Finding(check, Verdict.WARN, sentence, "H2, H3",
                       details={"new_head": ref.get("new_weights")})  # fmt: skip
    chance = ref["majority_scores"].get(metric, {})
    lows = ref["low"].get(metric, {})
    meaningful = {n for n, low in lows.items() if low > chance.get(n, 0.0) + EPS}
    kept = {n: v for n, v in reference.items() if n in meaningful}
    left = sorted(set(reference) - meaningful)
    why = (f"{len(left)} class(es) where the baseline does no better than always answering "
           f"the majority class `{ref.get('majority_class')}` ({LEVEL:.0%} bootstrap interval "
           f"reaching its score) are not judged against it: {', '.join(left[:6])}")  # fmt: skip
    if not kept:
        return Finding(check, Verdict.WARN, f"not judged: {why}; classes are judged by their "
                       "floors and against the control", "H2, H3",
                       details={"not_judged": left})  # fmt: skip
    found = _drops(per_class, kept, metric, tolerance, "baseline")
    if left:
        found.sentence += f"; {why}"
        found.details["not_judged"] = left
    return found


def baseline_note(metrics: dict[str, Any]) -> str | None:
    """What a reader of a baseline must know before comparing with it (H3): a new head, its
    scores chance. Said by `tunepilot baseline` and in the dossier."""
    ref = metrics.get("reference")
    head = [w for w in (ref or {}).get("new_weights") or [] if _is_head(w)]
    if not head:
        return None
    return (f"the baseline's head is new ({', '.join(head[:4])} randomly initialised, not in "
            "the checkpoint): its scores are those of a random head, chance and not a starting "
            "point; class drops are judged against the control instead (H3)")  # fmt: skip


def _is_head(weight: str) -> bool:
    """A new weight of the classification head (`classifier.weight`, `score.bias` ...)."""
    return any(part in weight.split(".") for part in ("classifier", "score", "head", "fc"))


def _per_class(metrics: dict[str, Any], metric: str) -> dict[str, tuple[float, int]]:
    """{class: (metric value, support)} from an evaluation's `per_class` block."""
    block = metrics.get("per_class")
    if not isinstance(block, dict):
        raise ValueError("classification metrics without a `per_class` block: per-class guards "
                         "need the per-class numbers evaluate() produces (H2)")  # fmt: skip
    return {
        str(name): (float(row[metric]), int(row.get("support", 0))) for name, row in block.items()
    }


def _label(metric: str) -> str:
    return {"f1": "F1", "precision": "precision", "recall": "recall"}[metric]


def _floors(
    per_class: dict[str, tuple[float, int]],
    metric: str,
    floor: float | None,
    class_floors: dict[str, float],
) -> Finding:
    """Every class with examples in this split must reach its floor (class_floors overrides)."""
    check = f"guard: class {_label(metric)} floor"
    if floor is None and not class_floors:
        return Finding(check, Verdict.PASS, "no per-class floor set (per_class_floor, "
                       "class_floors); classes are judged by their drop only", "H2")  # fmt: skip
    failing: dict[str, str] = {}
    judged = 0
    for name, (value, support) in per_class.items():
        bound = class_floors.get(name, floor)
        if bound is None or support == 0:
            continue  # a class absent from this split has no F1 to judge
        judged += 1
        if value + EPS < bound:
            failing[name] = f"class `{name}` {_label(metric)} {value:.2f} < floor {bound:.2f}"
    unknown = sorted(set(class_floors) - set(per_class))
    details = {"failing": list(failing.values()), "unknown_classes": unknown, "judged": judged}
    if failing:
        sentence = "; ".join(failing.values()) + ": below the floor the hypothesis set"
        return Finding(check, Verdict.FAIL, sentence, "H2", list(failing), details)
    if unknown:
        return Finding(check, Verdict.WARN, f"class_floors names {', '.join(unknown)}, absent "
                       "from this evaluation: fix the class name in hypothesis.classification_"
                       "guards.class_floors", "H2", unknown, details)  # fmt: skip
    return Finding(check, Verdict.PASS, f"all {judged} classes reach their floor", "H2",
                   details=details)  # fmt: skip


def _drops(
    per_class: dict[str, tuple[float, int]],
    reference: dict[str, tuple[float, int]],
    metric: str,
    tolerance: float,
    ref_name: str,
) -> Finding:
    """No class may lose more than `tolerance` against the reference (absolute metric)."""
    check = f"guard: class drop vs {ref_name}"
    failing: dict[str, str] = {}
    worst: tuple[float, str] | None = None
    for name, (value, support) in per_class.items():
        if name not in reference or (support == 0 and reference[name][1] == 0):
            continue
        ref = reference[name][0]
        drop = ref - value
        if worst is None or drop > worst[0]:
            worst = (drop, name)
        if drop > tolerance + EPS:
            failing[name] = (
                f"class `{name}` {_label(metric)} {value:.2f} < {ref_name} {ref:.2f} - "
                f"{tolerance:.2f}"
            )
    details = {"failing": list(failing.values()), "tolerance": tolerance, "reference": ref_name}
    if failing:
        return Finding(check, Verdict.FAIL, "; ".join(failing.values()), "H2", list(failing),
                       details)  # fmt: skip
    if worst is None:
        return Finding(check, Verdict.WARN, f"no class in common with the {ref_name}: nothing "
                       "to judge; check that both evaluations use the same labels", "H2",
                       details=details)  # fmt: skip
    sentence = (
        f"no class drops more than {tolerance:.2f} {_label(metric)} vs the {ref_name} "
        f"(largest change: `{worst[1]}` {-worst[0]:+.2f})"
    )
    return Finding(check, Verdict.PASS, sentence, "H2", details=details)


# --------------------------------------------------------------------------------------------
# extraction and format: rates against their minimums
# --------------------------------------------------------------------------------------------


def format_guards(campaign: Campaign, metrics: dict[str, Any]) -> list[Finding]:
    """JSON validity, schema validity and required-field presence vs the campaign's minimums."""
    g = campaign.hypothesis.extraction_guards
    findings: list[Finding] = []
    for key, attr, words in RATE_GUARDS:
        if key not in metrics:
            continue
        rate, minimum = float(metrics[key]), float(getattr(g, attr))
        n = metrics.get("n")
        count = f" ({round(rate * n)}/{n})" if isinstance(n, int) and n else ""
        check = f"guard: {key.replace('_', ' ')}"
        details = {"rate": rate, "minimum": minimum}
        if key == "schema_validity" and metrics.get("schema_checked") is False:
            details["note"] = "no target_schema: equals json_validity"
        if rate + EPS < minimum:
            sentence = (
                f"{rate:.1%}{count} of {words}, below the minimum {minimum:.1%} "
                f"(hypothesis.extraction_guards.{attr}); do not adopt"
            )
            findings.append(Finding(check, Verdict.FAIL, sentence, "H2", details=details))
        else:
            sentence = f"{rate:.1%}{count} of {words} (minimum {minimum:.1%})"
            findings.append(Finding(check, Verdict.PASS, sentence, "H2", details=details))
    if not findings:
        findings.append(Finding("guard: format", Verdict.WARN, "this evaluation has no format "
                                "rate (json_validity ...) to judge; the format task is judged by "
                                "its headline metric only", "H2"))  # fmt: skip
    return findings


# --------------------------------------------------------------------------------------------
# one run's guards, for what is delivered
# --------------------------------------------------------------------------------------------


def run_guards(campaign: Campaign, ledger: Any, run_id: str) -> list[Finding]:
    """The guards of one run's final validation evaluation (H2), against the baseline and, for
    a variant, the control run of the same seed, each only when evaluated the same way (V2).

    What `export` writes into the bundle and the demo reads before delivering: a run that
    fails a guard must not reach a colleague without saying so.
    """
    from tunepilot.ledger import BASELINE

    own = ledger.evaluations(run_id=run_id, split="validation")
    if not own:
        return []
    final = own[-1]

    def comparable(run: str) -> dict[str, Any] | None:
        evals = ledger.evaluations(run_id=run, split="validation")
        if not evals:
            return None
        last = evals[-1]
        same = (last.eval_config_hash, last.data_version) == (
            final.eval_config_hash, final.data_version)  # fmt: skip
        return last.metrics if same else None

    row = ledger.get_run(run_id)
    controls = [r.id for r in ledger.list_runs()
                if r.variant == CONTROL and r.seed == row.seed and r.status == "completed"
                and r.variant != row.variant]  # fmt: skip
    control = comparable(controls[-1]) if controls else None
    return check_guards(campaign, final.metrics, comparable(BASELINE), control)


def export_target(ws: Any, comparison: Any) -> tuple[str | None, str]:
    """The run to deliver and why: the adopted variant's (else the control's) first completed
    seed whose own guards pass (H2). A run that fails its guards is never delivered here; the
    demo and a launched job (`tunepilot.sizing.launch_step`) export what this returns."""
    from tunepilot.campaign.variants import variant_campaign
    from tunepilot.ledger import Ledger

    wanted = comparison.adopted or "control"
    campaign = variant_campaign(ws.campaign, wanted)
    failing: list[str] = []
    with Ledger.open(ws.ledger_path) as ledger:
        runs = [r for r in ledger.list_runs() if r.variant == wanted and r.status == "completed"]
        for r in sorted(runs, key=lambda r: (r.seed, r.id)):
            fails = [f.check for f in run_guards(campaign, ledger, r.id)
                     if f.verdict is Verdict.FAIL]  # fmt: skip
            if not fails:
                return r.id, f"{r.id} ({wanted}, seed {r.seed}; every guard passes)"
            failing.append(f"{r.id} fails {', '.join(fails)}")
    if not runs:
        return None, f"nothing (no completed `{wanted}` run)"
    return None, f"nothing: every completed `{wanted}` run fails its guards ({'; '.join(failing)})"
