"""The whole campaign, in the order a careful engineer runs it, on the demo folder:

audit -> baseline -> pilot -> plan -> the learning-rate sweep -> compare -> export -> verify
-> report. Each step is the ordinary command's body, so every file the demo leaves can be
re-read and re-run by hand. A FAIL does not stop the chain (the dossier must show it); it
makes the demo exit 1 at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunepilot.data.workspace import Workspace


@dataclass
class StepLog:
    """What each step returned and how long it took, for the closing summary."""

    rows: list[tuple[str, int, float]] = field(default_factory=list)
    must_fail: set[str] = field(default_factory=set)  # steps shown catching planted problems

    def run(self, name: str, body: Callable[[], int], *, must_fail: bool = False) -> int:
        from tunepilot.console import console

        console.rule(f"[bold]{name}")
        start = time.perf_counter()
        code = body()
        self.rows.append((name, code, time.perf_counter() - start))
        if must_fail:
            self.must_fail.add(name)
        return code

    def failed(self) -> list[str]:
        """Every step that did not pass: a FAIL (1), and also nothing to work on (2, e.g.
        compare with no comparable run), which is no more a pass than a FAIL is. A step run
        on planted problems fails the demo the other way round: when it does NOT say FAIL."""
        return [name if name not in self.must_fail else f"{name} (missed the planted problems)"
                for name, code, _ in self.rows
                if (code != 1 if name in self.must_fail else code != 0)]  # fmt: skip


def run_chain(campaign_path: Path, fix_data: Callable[[Workspace], str] | None = None) -> int:
    """Run every step; returns 1 if any step reported a FAIL, else 0.

    `fix_data` (the image demo): the first audit runs on data with planted problems and must
    FAIL naming them; `fix_data` then does what the audit asked (it returns what it did), the
    campaign is re-read and audited again, and the chain goes on with the fixed data."""
    from tunepilot.console import console
    from tunepilot.data.flow import audit_workspace
    from tunepilot.deliver.flow import export_command
    from tunepilot.deliver.verify import verify_command
    from tunepilot.experiments import flow as run_flow
    from tunepilot.experiments.compare import compare_campaign, compare_command
    from tunepilot.experiments.guards import export_target
    from tunepilot.pilot.flow import run_pilot
    from tunepilot.pilot.plan import run_plan
    from tunepilot.report.flow import write_report

    ws = Workspace.open(campaign_path)
    log = StepLog()
    total_start = time.perf_counter()
    if fix_data is not None:
        log.run("data audit of the planted problems (D1-D8)",
                lambda: audit_workspace(ws, as_json=False), must_fail=True)

        def fix() -> int:
            console.print(fix_data(ws), highlight=False, soft_wrap=True)
            return 0

        log.run("fix what the audit named", fix)
        ws = Workspace.open(campaign_path)
    log.run("data audit (D1-D8)", lambda: audit_workspace(ws, as_json=False))
    log.run("baseline (H3)", lambda: run_flow.baseline(ws, as_json=False))
    log.run("pilot: 13 gates (S1-S7, D7, D9)", lambda: run_pilot(ws, as_json=False))
    log.run("plan (L1, L3)", lambda: run_plan(ws, gpu=None, as_json=False))
    log.run("sweep: variants x seeds (V1-V6)",
            lambda: run_flow.run(ws, None, None, None, as_json=False))
    log.run("compare (V5-V7)", lambda: compare_command(ws, as_json=False))
    comparison = compare_campaign(ws)
    target, delivered = export_target(ws, comparison)
    bundle = ws.exports_dir / (target or "none")
    if target is not None:
        log.run(f"export {target} (P4, R3)", lambda: export_command(ws, target, None, False))
        log.run("verify in a new process (R2, R4)", lambda: verify_command(bundle, False))
    dossier: dict[str, Any] = {}

    def report_step() -> int:
        path, dossier["data"] = write_report(ws)
        console.print(f"dossier written: [bold]{path}[/]", highlight=False)
        return 0

    log.run("report (L4, L5)", report_step)

    console.rule("[bold]summary")
    minutes = (time.perf_counter() - total_start) / 60
    failed = log.failed()
    listed = [x["sentence"] for x in dossier["data"]["limits"] if x["severity"] == "FAIL"]
    for line in summary_lines(ws, comparison, delivered, target, minutes, failed, listed):
        console.print(line, highlight=False)
    return 1 if failed or listed else 0


def summary_lines(ws: Workspace, comparison: Any, delivered: str, target: str | None,
                  minutes: float, failed: list[str], listed: list[str]) -> list[str]:
    """Five lines a person reads first; every figure comes from the files the steps wrote.

    "every step passed" is said only when no step failed and the dossier lists no FAIL."""
    prepared = ws.prepare(write=False)
    counts = ", ".join(f"{k} {len(v)}" for k, v in prepared.splits.items())
    metric = comparison.metric
    by_name = {v.name: v for v in comparison.variants}
    control = by_name.get("control")
    control_mean = control.summary.get(metric, {}).get("mean") if control else None
    shown = f"{control_mean:.3f}" if isinstance(control_mean, int | float) else "n/a"
    checks = ("every step passed or warned and the dossier lists no FAIL"
              if not failed and not listed else
              "; ".join(([f"FAIL in: {', '.join(failed)}"] if failed else [])
                        + ([f"the dossier lists {len(listed)} FAIL (first: {listed[0]})"]
                           if listed else [])))  # fmt: skip
    return [
        f"1. data version {prepared.version} ({counts}); {checks}.",
        f"2. control {metric} on validation: {shown} (mean over seeds); "
        f"{len(comparison.variants) - 1} variant(s) compared.",
        f"3. decision: {comparison.decision}",
        f"4. delivered: {ws.exports_dir / target if target else delivered}",
        f"5. dossier: {ws.report_dir / 'index.html'} ({minutes:.1f} min in all)",
    ]
