"""A plan that can do what it says (S7, V4), judged by `tunepilot validate` before any rental.

The schema bounds each setting alone; these are the settings that are each valid and together
empty: a warm-up longer than the whole budget (the learning rate never reaches
`training.lr`), a validation interval longer than the run (no validation point inside it), a
budget that gives one update (no curve, nothing to compare), an update larger than the whole
training set (every update is the whole data, the last one partial). Each is judged on the
update arithmetic the loop itself follows (`arithmetic.plan_from_settings`) and on the training
split as prepared, for the campaign and every variant. Pure Python: no torch.
"""

from __future__ import annotations

from typing import Any

from tunepilot.train.arithmetic import plan_from_settings
from tunepilot.verdict import Finding, Verdict

CHECK = "the plan can do what it says"


def plan_findings(training: Any, n_train: int, where: str = "") -> list[Finding]:
    """WARN/FAIL findings for one campaign's training settings over `n_train` training
    examples (nothing when the plan holds); `where` names a variant in the sentence."""
    from tunepilot.errors import InputError

    label = f"{where}: " if where else ""
    try:
        plan = plan_from_settings(n_train, training)
    except InputError as err:  # drop_last with an update larger than the data
        problem = err.problems[0]
        return [Finding(CHECK, Verdict.FAIL, f"{label}{problem.found}; {problem.fix}", "S7")]
    total, per_update = plan.total_updates, plan.examples_per_update
    shape = (f"{training.microbatch} per microbatch x {training.accumulation} accumulations"
             + (f" x {plan.replicas} replicas" if plan.replicas > 1 else ""))  # fmt: skip
    found: list[Finding] = []

    def said(kind: str) -> dict[str, Any]:  # what the finding is about, to tell repeats apart
        return {**plan.to_json(), "problem": kind, "warmup_updates": training.warmup_updates,
                "eval_every": training.eval_every}  # fmt: skip

    if per_update > n_train:
        found.append(Finding(CHECK, Verdict.FAIL, (
            f"{label}{shape} = {per_update} examples per update, but training holds "
            f"{n_train}: every update is the whole training set at once, and the update "
            "arithmetic the budget was chosen by does not hold; lower training.microbatch or "
            "training.accumulation, or add training examples"), "S7", details=said("batch")))
    if total <= 1:
        found.append(Finding(CHECK, Verdict.FAIL, (
            f"{label}the budget gives {total} update ({plan.describe()}): no curve, no "
            "validation point, nothing to compare; raise training.budget"), "S7, V4",
            details=said("one update")))  # fmt: skip
    warmup = training.warmup_updates
    if warmup and warmup >= total:
        reach = ("never reaches it" if warmup > total else "reaches it only at the last update")
        found.append(Finding(CHECK, Verdict.FAIL, (
            f"{label}training.warmup_updates {warmup} >= the {total} updates of the budget: "
            f"the learning rate climbs towards training.lr {training.lr:g} and {reach} "
            f"(peak lr x {min(1.0, total / warmup):.2f}); lower warmup_updates to a tenth of "
            "the budget or less, or raise the budget"), "S7, V4", details=said("warmup")))
    if training.eval_every >= total > 1:
        found.append(Finding(CHECK, Verdict.WARN, (
            f"{label}training.eval_every {training.eval_every} >= the {total} updates of the "
            "budget: no validation point inside the run, only the final evaluation, so the "
            f"curve cannot show when it overfits; set eval_every to {max(1, total // 4)} or "
            "less"), "V4, V5", details=said("eval_every")))  # fmt: skip
    return found


def check_plan(campaign: Any, n_train: int) -> list[Finding]:
    """The campaign's plan and each variant's, one finding per problem (a variant that only
    repeats the control's problem is not listed again); a PASS line when all hold."""
    from tunepilot.campaign.variants import variant_campaign, variant_names
    from tunepilot.errors import InputError

    def about(f: Finding) -> str:
        keys = ("problem", "total_updates", "examples_per_update", "warmup_updates", "eval_every")
        return str([f.details.get(k) for k in keys]) if f.details else f.sentence

    found = plan_findings(campaign.training, n_train)
    seen = {about(f) for f in found}
    for name in variant_names(campaign)[1:]:
        try:
            training = variant_campaign(campaign, name).training
        except InputError:
            continue  # check_variants names a broken variant
        found += [f for f in plan_findings(training, n_train, where=f"variant `{name}`")
                  if about(f) not in seen]  # fmt: skip
    if found:
        return found
    plan = plan_from_settings(n_train, campaign.training)
    return [Finding(CHECK, Verdict.PASS, plan.describe(), "S7", details=plan.to_json())]


def check_plan_on_data(campaign: Any, root: Any) -> list[Finding]:
    """`check_plan` on the campaign's training split as prepared (never sealing a test: this
    is a look); a WARN saying why when the data does not prepare (the audit lists why)."""
    from tunepilot.data.prepare import prepare_data
    from tunepilot.errors import InputError

    try:
        prepared = prepare_data(campaign, root, write=False, seal=False)
    except InputError as err:
        first = err.problems[0] if err.problems else err
        sentence = (f"cannot check the plan against the data: {first}; `tunepilot data audit` "
                    "lists every problem of the data")  # fmt: skip
        return [Finding(CHECK, Verdict.WARN, sentence, "S7")]
    return check_plan(campaign, len(prepared.splits["train"]))
