"""`tunepilot size`: the dry run's table, and whether the peak fits the cards asked for."""

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

    cards = load_catalog(catalog)
    names = gpus or ([ws.campaign.rental.gpu] if ws.campaign.rental.gpu else [])
    chosen = [cards.card(name) for name in names]  # a missing card is bad input, before work
    result = dry_run(ws)
    peak = result.peak()
    fits = [
        {
            "gpu": card.name,
            **card.fit(
                peak.peak + result.cuda_context_bytes, ws.campaign.rental.margin, gpus=card.gpus
            ),
        }
        for card in chosen
    ]
    if as_json:
        from tunepilot.console import print_json

        print_json({"dry_run": result.to_json(), "fits": fits})
        return 0
    _print(result, fits)
    return 0


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
        console.print(f"{fit['gpu']}: {fit['verdict']} - {fit['sentence']} (with the CUDA "
                      "context assumed)", highlight=False)  # fmt: skip
