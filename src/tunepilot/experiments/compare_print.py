"""`tunepilot compare` on the console: the variants table (means over each one's seeds, the
paired delta with the seeds it rests on), each variant's failing guards and largest drops,
the runs left out with their reasons, and the decision panel."""

from __future__ import annotations

from typing import Any

from tunepilot.campaign.variants import CONTROL
from tunepilot.experiments.compare_stats import LEVEL
from tunepilot.verdict import Verdict


def _fmt(summary: dict[str, Any]) -> str:
    if summary.get("mean") is None:
        return "-"
    std = summary.get("std")
    return f"{summary['mean']:.4f}" + (f" ± {std:.4f}" if std is not None else "")


def _seeds(seeds: list[int]) -> str:
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"


def print_comparison(cmp: Any, console: Any, metrics: tuple[str, ...]) -> None:
    """`cmp` is compare.Comparison (not imported: compare imports this module); `metrics`
    the task's headline columns."""
    from rich.panel import Panel
    from rich.table import Table

    from tunepilot.console import findings_table

    table = Table(title=f"{cmp.campaign}: variants vs control (mean ± std over each one's "
                        "seeds; Δ paired, on the seeds both ran: V6)")
    for col in ("variant", "seeds", *metrics, f"Δ {cmp.metric} vs control [{LEVEL:.0%} CI], p",
                "guards"):  # fmt: skip
        table.add_column(col)
    for v in cmp.variants:
        ci = v.ci
        paired = sorted(ci["seeds"]) if ci else []
        shown = (f"{ci['diff']:+.4f} [{ci['low']:+.4f}, {ci['high']:+.4f}] Holm p "
                 f"{ci['p_holm']:.3f}, {_seeds(paired)}" if ci else "-")  # fmt: skip
        fails = sum(f.verdict is Verdict.FAIL for f in v.guards)
        guards = "-" if not v.guards else ("[red]FAIL[/]" if fails else "[green]PASS[/]")
        table.add_row(v.name, f"{len(v.used)}/{len({x.seed for x in v.runs})}",
                      *(_fmt(v.summary.get(m, {})) for m in metrics), shown, guards)  # fmt: skip
    console.print(table)
    control = next((v for v in cmp.variants if v.name == CONTROL), None)
    for v in cmp.variants:
        if v.ci and control is not None:
            means = {x.seed for x in v.used} | {x.seed for x in control.used}
            if set(v.ci["seeds"]) != means:  # never a mean beside a delta on other seeds
                console.print(
                    f"[yellow]note:[/] {v.name}: the means cover {_seeds(sorted(means))} "
                    f"(control {_seeds(sorted(x.seed for x in control.used))}); its Δ is "
                    f"paired on {_seeds(sorted(v.ci['seeds']))} only", highlight=False)
    for v in cmp.variants:
        judged = [f for f in v.guards if f.verdict is not Verdict.PASS]
        if judged:
            console.print(findings_table(judged, f"guards of {v.name} (H2)"))
        deltas = v.deltas.get("vs_control", {}).items()
        drops = sorted([(n, d) for n, d in deltas if d < 0], key=lambda kv: kv[1])[:5]
        if drops:
            words = ", ".join(f"{n} {d:+.3f}" for n, d in drops)
            console.print(f"[dim]{v.name}: largest drops vs control: {words}[/]")
    dropped = [x for v in cmp.variants for x in v.runs if x.excluded]
    if dropped:
        runs = Table(title="runs not in the numbers, with their reasons (V3)")
        for col in ("run", "variant", "seed", "why"):
            runs.add_column(col)
        for x in dropped:
            runs.add_row(x.run_id, x.variant, str(x.seed), x.excluded or "")
        console.print(runs)
    for note in cmp.notes:
        console.print(f"[yellow]note:[/] {note}")
    style = "green" if cmp.adopted else ("yellow" if cmp.comparable else "red")
    console.print(Panel(cmp.decision, title="decision", border_style=style))
