"""`tunepilot size`: the dry run's table, and whether the campaign fits the cards asked for.

Each card is judged by the one verdict (`sizing.fit.fit`) that `plan` and its sheet use: every
phase per GPU with the device context and the headroom kept free, every precision the step
computes in, at settings the card can run (model.base_dtype unset: bf16 where the card has
it, fp32 where not, a dry run of its own), under each layout a machine of several GPUs can
run. Exit 1 when an asked card does not PASS.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunepilot.data.workspace import Workspace

COLUMNS = ("weights", "gradients", "optimizer", "activations", "temporaries", "peak")


def run_size(
    ws: Workspace, gpus: list[str] | None = None, as_json: bool = False,
    catalog: Path | None = None,
) -> int:  # fmt: skip
    """Dry-run the campaign on its target architecture, print the phases, judge each card."""
    from tunepilot.sizing.catalog import load_catalog
    from tunepilot.sizing.dry_run.run import dry_run
    from tunepilot.sizing.fit import best_fit, machine_fits, resolved_base

    cards = load_catalog(catalog)
    names = gpus or ([ws.campaign.rental.gpu] if ws.campaign.rental.gpu else [])
    chosen = [cards.card(name) for name in names]  # a missing card is bad input, before work
    from tunepilot.progress import start_line

    start_line(f"size: dry run of {ws.campaign.model.name_or_path}'s step (each phase, 2 and 3 "
               "blocks)")  # fmt: skip
    result = dry_run(ws)
    configured = ws.campaign.model.base_dtype
    by_base = {result.phases[0].inputs.get("base_dtype"): result}
    fits = []
    for card in chosen:
        base = resolved_base(card, configured)
        if base not in by_base:  # the base this card loads differs: a dry run of its own
            by_base[base] = dry_run(ws, base_dtype=base)
        found = best_fit(machine_fits(card, by_base[base]))
        fits.append({"gpu": card.name, "base_dtype": base, **found.to_json()})
    if as_json:
        from tunepilot.console import print_json

        print_json({"dry_run": result.to_json(), "fits": fits})
    else:
        _print(result, fits)
    return 0 if all(f["verdict"] == "PASS" for f in fits) else 1


def _print(result: Any, fits: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from tunepilot.console import console
    from tunepilot.measure.memory import human_bytes

    table = Table(title=f"dry run: {result.model} ({result.architecture}, {result.layers} blocks)")
    for column in ("phase", *COLUMNS, "GFLOPs", "shape"):
        table.add_column(column, justify="left" if column in ("phase", "shape") else "right")
    for p in result.phases:
        size = p.inputs.get("image") or p.inputs["length"]
        shape = f"{p.inputs['microbatch']} x {size}" if size and p.inputs["microbatch"] else "-"
        table.add_row(p.phase, *(human_bytes(getattr(p, c)) for c in COLUMNS),
                      f"{p.flops / 1e9:,.1f}", shape)  # fmt: skip
    console.print(table)
    console.print(
        f"{result.trainable_params:,} of {result.total_params:,} parameters trainable; "
        f"peak in {result.peak().phase}: {human_bytes(result.peak().peak)}; {result.seconds} s"
    )
    for note in result.notes:
        console.print(f"  - {note}", highlight=False)
    added = {k for p in result.phases for k in p.analytical}
    for name in sorted(added):
        console.print(f"  - added: {name}", highlight=False)
    for fit in fits:
        console.print(f"{fit['gpu']}: {fit['verdict']} - {fit['sentence']} (base "
                      f"{fit['base_dtype']}, the device context assumed; `tunepilot plan --gpu` "
                      "names the nearest change)", highlight=False)  # fmt: skip
