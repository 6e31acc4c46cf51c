"""The experiment commands: baseline, run, resume, runs, note (H3, V1-V6, L4).

Each opens the ledger (which marks runs whose process died as interrupted), does one job, and
prints a short table. Library code below raises; only the CLI turns results into exit codes.
"""

from __future__ import annotations

from typing import Any

from tunepilot.campaign.variants import parse_seeds, variant_names
from tunepilot.data.workspace import Workspace
from tunepilot.errors import input_error
from tunepilot.experiments.runner import outcome_code


def _open_ledger(ws: Workspace) -> Any:
    from tunepilot.console import error_console
    from tunepilot.ledger import Ledger

    ledger = Ledger.open(ws.ledger_path)
    for dead in ledger.interrupted_on_open:  # stderr: a --json stdout holds the document only
        error_console.print(f"[yellow]marked {dead.run_id} interrupted[/]: {dead.reason}")
    try:
        say_relocated(ledger)
        check_hypothesis(ws, ledger)
    except Exception:
        ledger.close()
        raise
    return ledger


def say_relocated(ledger: Any) -> None:
    """A moved or copied campaign folder reads its own run folders, and says so (stderr)."""
    note = ledger.relocation_note()
    if note:
        from tunepilot.console import error_console

        error_console.print(f"[yellow]note:[/] {note}", highlight=False)


def check_hypothesis(ws: Workspace, ledger: Any) -> None:
    """H1: once fixed, the hypothesis and guards change only as a recorded amendment, so a
    guard cannot be loosened silently after the results are in."""
    from tunepilot.campaign import stable_hash

    history = ledger.hypothesis_history()
    current = stable_hash(ws.campaign.hypothesis.model_dump(mode="json"))
    if history and history[-1].hash != current:
        raise input_error(
            f"{ws.campaign_file} hypothesis",
            f"differs from the one fixed in the ledger on {history[0].at[:10]} "
            f"(hash {history[-1].hash} -> {current})",
            f'record why: `tunepilot amend "<reason>" {ws.campaign_file}` (the original stays '
            "next to the amendment in the report), or restore the original text")


def check_hypothesis_before(ws: Workspace) -> Workspace:
    """For commands that read the ledger themselves (compare): refuse a silent change first."""
    with _open_ledger(ws):
        pass
    return ws


def amend(ws: Workspace, reason: str) -> int:
    """Record the campaign's current hypothesis and guards as an amendment with its reason."""
    from tunepilot.console import console
    from tunepilot.ledger import Ledger

    if not reason.strip():
        raise input_error("REASON", "an empty reason", "say why the hypothesis changed")
    with Ledger.open(ws.ledger_path) as ledger:
        if not ledger.hypothesis_history():
            raise input_error("hypothesis", "nothing is fixed yet",
                              f"run `tunepilot baseline {ws.campaign_file}` first: it fixes it")
        digest = ledger.fix_hypothesis(ws.campaign.hypothesis.model_dump(mode="json"), reason)
    console.print(f"hypothesis amendment recorded (hash {digest}): {reason}")
    return 0


def baseline(ws: Workspace, as_json: bool) -> int:
    from tunepilot.console import console, print_json
    from tunepilot.experiments.baseline import run_baseline
    from tunepilot.experiments.runner import Session

    with _open_ledger(ws) as ledger:
        result = run_baseline(Session(ws), ledger)
    if as_json:
        print_json({"metrics": result.metrics, "config_hash": result.config_hash})
    else:
        console.print(f"baseline (H3): {_headline(result.metrics)}; "
                      f"predictions kept in {ws.root / 'baseline'}")
    from tunepilot.experiments.guards import baseline_note

    if note := baseline_note(result.metrics):  # stderr under --json: stdout is the document
        from tunepilot.console import error_console

        (error_console if as_json else console).print(f"[yellow]note:[/] {note}",
                                                      highlight=False)  # fmt: skip
    return 0


def run_any(ws: Workspace, variants: list[str] | None, seeds: str | None,
            stop_after: int | None, as_json: bool, *, nproc: int | None = None,
            strategy: str | None = None, jobs: int | None = None,
            torchrun_args: list[str] | None = None, retry_of: str | None = None) -> int:
    """Route `tunepilot run`: side-by-side jobs, torchrun replicas (B3, B4), or in-process."""
    from tunepilot.experiments import jobs as jobs_module

    if retry_of:
        return retry(ws, retry_of, stop_after, as_json)
    parse_seeds(seeds, ws.campaign.seeds)  # a bad --seeds is refused before anything starts
    dist = ws.campaign.training.distributed
    replicas = nproc or dist.nproc
    if jobs and replicas > 1:
        raise input_error("--jobs", "--jobs runs whole runs side by side; it cannot be combined "
                          f"with {replicas} replicas per run", "use one of --jobs or --nproc")
    if jobs:
        return jobs_module.run_jobs(ws, variants, seeds, jobs, stop_after=stop_after)
    # torchrun flags (several nodes) make even one process per node a distributed run
    if replicas > 1 or torchrun_args or (strategy or dist.strategy) != "none":
        names = variants or variant_names(ws.campaign)
        codes = [
            jobs_module.run_distributed(ws, name, seed, replicas, strategy,
                                        torchrun_args=torchrun_args or (), stop_after=stop_after)
            for name in names for seed in parse_seeds(seeds, ws.campaign.seeds)
        ]
        return max(codes, default=0)
    return run(ws, variants, seeds, stop_after, as_json)


def resume_any(ws: Workspace, run_id: str, stop_after: int | None, as_json: bool,
               nproc: int | None = None, torchrun_args: list[str] | None = None,
               from_step: str | None = None, expect: str | None = None,
               allow_backend_change: bool = False) -> int:
    """A run that trained with replicas resumes with the same strategy and world size.
    `from_step` (`step-N`) picks the checkpoint instead of the newest that verifies; `expect`
    (a MANIFEST.json sha256) pins it: that checkpoint or a refusal, never a fallback. A run
    resumes on the backend it trained on, unless `allow_backend_change` (B1)."""
    from tunepilot.experiments.jobs import distributed_settings_of, resume_distributed
    from tunepilot.experiments.recovery import pinned_step, resume_backend
    from tunepilot.train.checkpoint import latest_checkpoint
    from tunepilot.train.resume_point import parse_step

    with _open_ledger(ws) as ledger:  # an unknown id (or a path) is refused before any file read
        run_dir = ledger.run_folder(ledger.get_run(run_id))
        note = resume_backend(ws, run_id, run_dir, allow_backend_change)
        if note:
            ledger.add_note(note, run_id=run_id)
            from tunepilot.console import error_console

            error_console.print(f"[yellow]note:[/] {note}", highlight=False)
    step = None if from_step is None else parse_step(from_step)
    if expect is not None:
        step = pinned_step(run_id, run_dir, expect, step)
    if distributed_settings_of(ws.runs_dir / run_id) is not None:
        newest = latest_checkpoint(run_dir)
        if expect is not None and newest is not None and parse_step(newest.name) == step:
            step = None  # the pinned one is the newest: the replicas resume from it
        if step is not None:
            raise input_error("--from", "a run trained with replicas resumes from its newest "
                              "checkpoint that verifies", "leave out --from")  # fmt: skip
        return resume_distributed(ws, run_id, nproc, torchrun_args=torchrun_args or (),
                                  stop_after=stop_after)
    return resume(ws, run_id, stop_after, as_json, from_step=step)


def _one_outcome(outcome: Any, as_json: bool, line: str) -> int:
    """Print one run's outcome (its JSON under --json, else `line`); its exit code."""
    from tunepilot.console import console, print_json

    if as_json:
        print_json(_outcome_json(outcome))
    else:
        console.print(line, markup=False, highlight=False)  # a reason may quote `[input]`
    return outcome_code([outcome.status])


def retry(ws: Workspace, run_id: str, stop_after: int | None, as_json: bool) -> int:
    """A new attempt at a run: a new id whose retry_of names it; the original keeps its line."""
    from tunepilot.experiments.runner import Session, execute_run

    with _open_ledger(ws) as ledger:
        original = ledger.get_run(run_id)
        outcome = execute_run(Session(ws), ledger, original.variant, original.seed,
                              retry_of=run_id, stop_after=stop_after)
    return _one_outcome(outcome, as_json, f"{outcome.run_id} (retry of {run_id}): "
                        f"{outcome.status} ({outcome.reason}) {_headline(outcome.metrics)}")


def run(ws: Workspace, variants: list[str] | None, seeds: str | None, stop_after: int | None,
        as_json: bool) -> int:
    """Variants x seeds, one after the other; a failure is recorded and the sweep goes on."""
    from tunepilot.console import console, error_console, print_json
    from tunepilot.experiments.runner import Session, execute_run

    say = error_console if as_json else console  # --json: stdout holds the document only
    names = variants or variant_names(ws.campaign)
    unknown = [v for v in names if v not in variant_names(ws.campaign)]
    if unknown:
        raise input_error("--variant", f"unknown variant(s) {', '.join(unknown)}",
                          f"use one of {', '.join(variant_names(ws.campaign))}")
    session = Session(ws)
    outcomes = []
    pairs = [(name, seed) for name in names for seed in parse_seeds(seeds, ws.campaign.seeds)]
    with _open_ledger(ws) as ledger:
        from tunepilot.experiments.recovery import other_backends

        if elsewhere := other_backends(ws, ledger):
            error_console.print(f"[yellow]note:[/] {elsewhere}", highlight=False)
        for index, (name, seed) in enumerate(pairs, start=1):
            place = f"run {index} of {len(pairs)}"
            say.print(f"[bold]{place}[/]: {name} seed {seed}")
            outcome = execute_run(session, ledger, name, seed, stop_after=stop_after, place=place)
            outcomes.append(outcome)
            say.print(f"  {outcome.run_id}: {outcome.status} ({outcome.reason}) "
                      f"{_headline(outcome.metrics)}", markup=False, highlight=False)
    if as_json:
        print_json([_outcome_json(o) for o in outcomes])
    return outcome_code(o.status for o in outcomes)


def resume(ws: Workspace, run_id: str, stop_after: int | None, as_json: bool,
           from_step: int | None = None) -> int:
    from tunepilot.experiments.runner import Session, execute_run

    with _open_ledger(ws) as ledger:
        outcome = execute_run(Session(ws), ledger, resume_run_id=run_id, stop_after=stop_after,
                              from_step=from_step)  # fmt: skip
    line = (f"{outcome.run_id}: {outcome.status} after {outcome.updates} updates "
            f"({outcome.reason}) {_headline(outcome.metrics)}")  # fmt: skip
    return _one_outcome(outcome, as_json, line)


def list_runs(ws: Workspace, as_json: bool) -> int:
    """Every run, failures included (V3), with its last validation figure of the campaign's
    headline metric (the one `compare` decides on)."""
    from rich.table import Table

    from tunepilot.console import console, print_json
    from tunepilot.experiments.compare import HEADLINES

    metric = HEADLINES.get(ws.campaign.hypothesis.task, ("loss",))[0]
    with _open_ledger(ws) as ledger:
        rows = ledger.list_runs()
        last = {e.run_id: e.metrics.get(metric) for e in ledger.evaluations(split="validation")}
    if as_json:
        print_json([{"id": r.id, "variant": r.variant, "seed": r.seed, "status": r.status,
                     "reason": r.reason, "retry_of": r.retry_of, "data_version": r.data_version,
                     "config_hash": r.config_hash, "metric": metric,
                     "validation": last.get(r.id)} for r in rows])  # fmt: skip
        return 0
    table = Table(title=f"runs of {ws.campaign.name} (every run, failures included: V3)")
    for col in ("run", "variant", "seed", "status", f"{metric} (validation)", "reason",
                "retry of"):  # fmt: skip
        table.add_column(col, justify="right" if "validation" in col else "left")
    from rich.markup import escape  # a reason quotes the user's input, e.g. `[no_such]`

    for r in rows:
        value = last.get(r.id)
        shown = f"{value:.4f}" if isinstance(value, int | float) else "-"
        table.add_row(r.id, r.variant, str(r.seed), r.status, shown, escape(r.reason or ""),
                      r.retry_of or "")  # fmt: skip
    console.print(table)
    return 0


def note(ws: Workspace, text: str, run_id: str | None) -> int:
    from tunepilot.console import console

    with _open_ledger(ws) as ledger:
        if run_id:
            ledger.get_run(run_id)
        number = ledger.add_note(text, run_id=run_id)
    console.print(f"note {number} recorded" + (f" for {run_id}" if run_id else ""))
    return 0


def _headline(metrics: dict[str, Any]) -> str:
    """The validation numbers after a run, named as such: a bare "loss" here was read as the
    training loss the progress line shows just above."""
    from tunepilot.experiments.compare import HEADLINE_KEYS

    shown = [f"{k} {metrics[k]:.4f}" for k in HEADLINE_KEYS
             if isinstance(metrics.get(k), int | float)]  # fmt: skip
    return f"validation {', '.join(shown)}" if shown else ""


def _outcome_json(o: Any) -> dict[str, Any]:
    return {"run_id": o.run_id, "status": o.status, "reason": o.reason, "updates": o.updates,
            "run_dir": str(o.run_dir), "metrics": o.metrics}
