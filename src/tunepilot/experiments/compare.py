"""Variants against their control, over every seed, ending in a decision (V2, V3, V5-V7, H2).

Read from the ledger (and each run's config.resolved.yaml and env.json): per variant its runs
by seed, the final validation evaluation of each completed run, mean and standard deviation of
the headline metrics over *all* seeds (V6), a paired bootstrap confidence interval of the
difference to the control on per-example predictions, per-class (per-field) deltas, and the
guards vs the baseline and the control (H2).
Runs that diverged, were interrupted, failed or are invalid keep their line and reason (V3); a
run evaluated under another eval config or data version, trained with other settings than its
variant has in the campaign, or on another backend than the control's, is not compared, and
says why (V1, V2, B1; eligibility.py).
The decision follows one written rule (decision.py): guards pass, the gain survives a Holm
correction across the variants, and it rests on more than one seed; otherwise the control
stays, a result in its own right (V7).

The interval comes from a paired hierarchical bootstrap (compare_stats.py): each resample draws
seeds and examples with replacement, the same draw for the control and the variant, and the
headline metric is recomputed from per-example contributions (per-class counts, per-field token
F1), so both seed-to-seed and example-to-example variance are in it.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from tunepilot.campaign import Campaign
from tunepilot.campaign.variants import CONTROL
from tunepilot.experiments.compare_stats import (
    BOOTSTRAP_SEED,
    LEVEL,
    RESAMPLES,
    hierarchical_bootstrap,
    make_scorer,
    stacked,
)
from tunepilot.experiments.decision import decide
from tunepilot.experiments.eligibility import exclude_unpoolable, incomparable
from tunepilot.experiments.guards import check_guards
from tunepilot.verdict import Finding, Verdict

HEADLINES = {
    "classification": ("macro_f1", "accuracy"),
    "image_classification": ("macro_f1", "accuracy"),
    "extraction": ("field_token_f1_macro", "required_field_presence", "json_validity"),
    "format": ("token_f1", "exact_match"),
}
HEADLINE_KEYS = (*dict.fromkeys(k for names in HEADLINES.values() for k in names), "loss")
"""Every task's headline metrics, then the loss: what a run's or a test look's summary shows."""
BOOTSTRAP_METHOD = "paired hierarchical bootstrap: seeds and examples resampled"


@dataclass
class RunLine:
    """One run as the comparison sees it; `excluded` says why it is not in the numbers."""

    run_id: str
    variant: str
    seed: int
    # how it ended, and why the numbers leave it out (None: it counts)
    status: str
    reason: str = ""
    excluded: str | None = None
    retry_of: str | None = None
    backend: str | None = None  # what it ran on (B1): set by eligibility.exclude_unpoolable
    # the evidence it contributes: its final validation evaluation
    evaluation_id: int | None = None
    eval_config_hash: str | None = None
    data_version: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class VariantResult:
    """A variant (or the control) over its seeds: numbers, interval, guards, blockers."""

    name: str
    runs: list[RunLine]
    summary: dict[str, dict[str, Any]] = field(default_factory=dict)  # metric -> mean, std, values
    mean: dict[str, Any] = field(default_factory=dict)  # seed-averaged metrics, per class included
    ci: dict[str, Any] | None = None
    deltas: dict[str, dict[str, float]] = field(default_factory=dict)  # vs_control / vs_baseline
    guards: list[Finding] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)  # why it cannot be adopted

    @property
    def used(self) -> list[RunLine]:
        return [r for r in self.runs if r.excluded is None]


@dataclass
class Comparison:
    campaign: str
    task: str
    metric: str
    variants: list[VariantResult]
    notes: list[str] = field(default_factory=list)
    reference: dict[str, Any] = field(default_factory=dict)
    decision: str = ""
    adopted: str | None = None
    comparable: bool = True  # False: nothing to compare (no completed control)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (verdicts are str enums), as written to comparison.json. A run line keeps
        its scalar metrics; the per-class (per-field) blocks are in its variant's seed mean,
        so the file grows by a line per run, not by every class of every run."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "variants"}
        out["variants"] = [
            {**{f.name: getattr(v, f.name) for f in fields(v) if f.name not in ("runs", "guards")},
             "guards": [asdict(g) for g in v.guards],
             "runs": [{**{f.name: getattr(x, f.name) for f in fields(x) if f.name != "metrics"},
                       "metrics": {k: m for k, m in x.metrics.items()
                                   if not isinstance(m, dict | list)}} for x in v.runs]}
            for v in self.variants
        ]  # fmt: skip
        return out


# --------------------------------------------------------------------------------------------
# reading the ledger
# --------------------------------------------------------------------------------------------


def compare_campaign(
    ws: Any, *, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> Comparison:
    """The comparison of a campaign folder's ledger (see `compare_ledger`)."""
    from tunepilot.ledger import Ledger

    with Ledger.open(ws.ledger_path) as ledger:  # marks runs whose process died (V3)
        cmp = compare_ledger(ws.campaign, ledger, resamples=resamples, seed=seed)
        cmp.notes += [
            f"marked {d.run_id} interrupted: {d.reason}" for d in ledger.interrupted_on_open
        ]
    return cmp


def compare_ledger(
    campaign: Campaign, ledger: Any, *, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> Comparison:
    from tunepilot.ledger import BASELINE

    task = campaign.hypothesis.task
    cmp = Comparison(campaign.name, task, HEADLINES[task][0], [])
    finals: dict[str, Any] = {}  # each run's last validation evaluation, read in one query
    for e in ledger.evaluations(split="validation"):
        finals[e.run_id] = e
    lines = [_line(finals, r) for r in ledger.list_runs()]
    names = list(dict.fromkeys([CONTROL, *campaign.variants, *(x.variant for x in lines)]))
    cmp.variants = [VariantResult(n, [x for x in lines if x.variant == n]) for n in names]
    cmp.notes += exclude_unpoolable(cmp.variants, campaign, ledger)
    control = cmp.variants[0]
    evaluated = [x for x in control.runs if x.excluded is None]
    if not evaluated:
        cmp.comparable = False
        cmp.decision = (
            "Nothing to compare: the control has no completed run with a validation "
            "evaluation; run it first (`tunepilot run --variant control`)."
        )
        return cmp
    ref = max(evaluated, key=lambda x: x.evaluation_id or 0)
    cmp.reference = {"run": ref.run_id, "eval_config_hash": ref.eval_config_hash,
                     "data_version": ref.data_version}  # fmt: skip
    for v in cmp.variants:
        _exclude_incomparable(v, ref)
    baseline_evals = ledger.evaluations(run_id=BASELINE, split="validation")
    baseline = None
    if not baseline_evals:
        cmp.notes.append("no baseline evaluation: guards vs the starting model are not judged; "
                         "run `tunepilot baseline` (H3)")  # fmt: skip
    else:
        b = baseline_evals[-1]
        why = incomparable(b.eval_config_hash, b.data_version, ref, b.metrics)
        if why:
            cmp.notes.append(f"the baseline is not compared: {why}")
        else:
            baseline = b.metrics
    for v in cmp.variants:
        _summarise(campaign, v, baseline)
    control_mean = control.mean
    control.guards = check_guards(campaign, control_mean, baseline, None)
    predictions: dict[int, dict[str, Any]] = {}  # per evaluation, read once for every variant
    for v in cmp.variants[1:]:
        if not v.used:
            continue
        v.guards = check_guards(campaign, v.mean, baseline, control_mean)
        v.deltas["vs_control"] = _deltas(campaign, v.mean, control_mean)
        v.ci = _interval(ledger, task, control, v, resamples, seed, predictions)
    decide(cmp)
    return cmp


def _line(finals: dict[str, Any], r: Any) -> RunLine:
    line = RunLine(r.id, r.variant, r.seed, r.status, r.reason or "", retry_of=r.retry_of)
    if r.status != "completed":
        line.excluded = f"{r.status}: {r.reason}" if r.reason else r.status
        return line
    e = finals.get(r.id)  # the final one: the run's result
    if e is None:
        line.excluded = "completed, but no validation evaluation in the ledger"
        return line
    line.evaluation_id, line.metrics = e.id, e.metrics
    line.eval_config_hash, line.data_version = e.eval_config_hash, e.data_version
    return line


def _exclude_incomparable(v: VariantResult, ref: RunLine) -> None:
    """Mark runs under another eval config / data version, and older repeats of a seed."""
    latest: dict[int, RunLine] = {}
    for x in v.used:
        why = incomparable(x.eval_config_hash, x.data_version, ref, x.metrics)
        if why:
            x.excluded = f"not compared: {why}"
            continue
        if x.seed in latest:  # the later completed run of a seed counts; the earlier is listed
            latest[x.seed].excluded = f"superseded by {x.run_id}, a later run of this seed"
        latest[x.seed] = x
    seeds = {x.seed for x in v.runs}
    missing = sorted(seeds - set(latest))
    for s in missing:  # an unfinished seed blocks adoption; one declared invalid does not
        last = [x for x in v.runs if x.seed == s][-1]
        if last.status != "invalid":
            v.blocked.append(f"seed {s} has no comparable completed run ({last.excluded})")


def _summarise(campaign: Campaign, v: VariantResult, baseline: dict[str, Any] | None) -> None:
    """Mean and standard deviation over every used seed (V6), and deltas vs the baseline."""
    used = v.used
    for key in HEADLINES[campaign.hypothesis.task]:
        values = {str(x.seed): float(x.metrics[key]) for x in used
                  if isinstance(x.metrics.get(key), int | float)}  # fmt: skip
        v.summary[key] = {
            "mean": statistics.fmean(values.values()) if values else None,
            "std": statistics.stdev(values.values()) if len(values) > 1 else None,
            "values": values,  # every seed, never only the best (V6)
        }
    v.mean = _mean_metrics([x.metrics for x in used])
    if used and baseline is not None:
        v.deltas["vs_baseline"] = _deltas(campaign, v.mean, baseline)


def _mean_metrics(all_metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Seed-averaged metrics, nested blocks (per_class, per_field) included."""
    if not all_metrics:
        return {}
    out: dict[str, Any] = {}
    for key, first in all_metrics[0].items():
        values = [m.get(key) for m in all_metrics]
        if all(isinstance(x, dict) for x in values):
            out[key] = _mean_metrics(values)
        elif all(isinstance(x, int | float) and not isinstance(x, bool) for x in values):
            out[key] = statistics.fmean(values)
        else:
            out[key] = first
    return out


def _deltas(campaign: Campaign, metrics: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    """Per class (guard metric) or per field (token F1): metrics minus reference."""
    if campaign.hypothesis.is_classification:
        block, key = "per_class", campaign.hypothesis.classification_guards.metric
    else:
        block, key = "per_field", "token_f1"
    mine, theirs = metrics.get(block) or {}, ref.get(block) or {}
    return {n: mine[n][key] - theirs[n][key] for n in mine if n in theirs and key in mine[n]}


# --------------------------------------------------------------------------------------------
# the paired bootstrap on per-example predictions
# --------------------------------------------------------------------------------------------


def _interval(ledger: Any, task: str, control: VariantResult, v: VariantResult,
              resamples: int, seed: int,
              cache: dict[int, dict[str, Any]]) -> dict[str, Any] | None:  # fmt: skip
    """The CI of (variant - control) on the headline metric over the seeds both completed:
    seeds and examples resampled together (hierarchical), the same draw for both sides."""
    by_seed = {x.seed: x for x in control.used}
    pairs = [(by_seed[x.seed], x) for x in v.used if x.seed in by_seed]
    if not pairs:
        v.blocked.append(f"no seed in common with the control (control seeds "
                         f"{sorted(by_seed)}); run both on the same seeds (V6)")  # fmt: skip
        return None
    for x in {x.evaluation_id for pair in pairs for x in pair} - cache.keys():
        cache[x] = {p.example_id: p for p in ledger.predictions(x)}
    preds = {x.run_id: cache[x.evaluation_id] for pair in pairs for x in pair}
    ids = sorted(set.intersection(*(set(p) for p in preds.values())))
    if not ids:
        v.blocked.append("no example predictions in common with the control")
        return None
    scorer = make_scorer(task, [p for run in preds.values() for p in run.values()])
    control_runs = stacked(scorer, [preds[c.run_id] for c, _ in pairs], ids)
    variant_runs = stacked(scorer, [preds[x.run_id] for _, x in pairs], ids)
    found = hierarchical_bootstrap(control_runs, variant_runs, scorer.value, resamples, seed)
    return {"metric": scorer.metric, "diff": found.diff, "low": found.low, "high": found.high,
            "level": LEVEL, "p_value": found.p_value, "resamples": resamples,
            "bootstrap_seed": seed, "seeds": [x.seed for _, x in pairs],
            "n_examples": len(ids), "method": BOOTSTRAP_METHOD}  # fmt: skip


# --------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------


def decided(ws: Any) -> tuple[Comparison, Any | None, bool]:
    """Compare the campaign folder's runs and keep the decision in the ledger (L4,
    decision_record.py): (comparison, the Decision that stands or None when there is nothing
    to compare, whether it was new)."""
    from tunepilot.experiments.decision_record import record_comparison
    from tunepilot.ledger import Ledger

    with Ledger.open(ws.ledger_path) as ledger:  # marks runs whose process died (V3)
        cmp = compare_ledger(ws.campaign, ledger)
        cmp.notes += [f"marked {d.run_id} interrupted: {d.reason}"
                      for d in ledger.interrupted_on_open]  # fmt: skip
        if not cmp.comparable:
            return cmp, None, False
        decision, new = record_comparison(ledger, ws.campaign, cmp)
    return cmp, decision, new


def compare_command(ws: Any, as_json: bool) -> int:
    """`tunepilot compare`: the table, the decision (kept in the ledger, decision_record.py),
    and <campaign>/comparison.json, its latest view.

    Exit 0 with a decision whose configuration passes its guards (keeping a sound control is
    one), 1 when the configuration the decision ends on fails a guard (the kept control fails,
    so every run fails), 2 when there is nothing to compare.
    """
    from tunepilot.console import console, print_json
    from tunepilot.errors import write_json_atomic
    from tunepilot.experiments.compare_print import print_comparison

    cmp, record, new = decided(ws)  # every decision is kept in the ledger's notebook (L4)
    payload = cmp.to_json()
    if record is not None:
        payload["decision_record"] = record.to_json() | {"new": new}
        write_json_atomic(ws.root / "comparison.json", payload)  # the latest view of it
    if as_json:
        print_json(payload)
    else:
        print_comparison(cmp, console, HEADLINES[cmp.task])
        if record is not None:
            kept = (f"decision #{record.id} recorded in the notebook" if new else
                    f"the same evidence and conclusion as decision #{record.id}: nothing new "
                    "recorded")  # fmt: skip
            console.print(f"[dim]{kept} (evidence sha256 {record.evidence_sha256[:16]}); "
                          f"written to {ws.root / 'comparison.json'}[/]")  # fmt: skip
    if not cmp.comparable:
        return 2
    return 1 if ending_fails_guards(cmp) else 0


def ending_fails_guards(cmp: Comparison) -> bool:
    """The configuration the decision ends on (the adopted variant, else the control) fails a
    guard: the campaign has no result that meets its own hypothesis (H2)."""
    ending = next(v for v in cmp.variants if v.name == (cmp.adopted or CONTROL))
    return any(f.verdict is Verdict.FAIL for f in ending.guards)
