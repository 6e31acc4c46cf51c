"""Before renting: the dry run, the pilot (13 gates) and the plan (sizing sheet, 3/7/30-day
package)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunepilot.cli.app import (
    CampaignArgs,
    JsonFlag,
    app,
    open_workspace,
    run_body,
)

# ---------------------------------------------------------------------------------------------
# before renting: pilot, plan
# ---------------------------------------------------------------------------------------------

Gpu = Annotated[str | None, typer.Option("--gpu", help="A card of the GPU catalog to plan for.")]
Catalog = Annotated[
    Path | None, typer.Option("--catalog", help="Your GPU catalog (YAML) with prices filled in.")
]


@app.command()
def pilot(
    args: CampaignArgs = None,
    gpu: Gpu = None,
    catalog: Catalog = None,
    tensors: Annotated[
        bool, typer.Option("--tensors", help="Also measure tensor bytes (PyTorch profiler).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Run every operation of the campaign once, each as a gate that ends PASS, WARN or FAIL
    with what was seen and what to do: environment, data, inspect, load, update audit, first
    step, steady step, accumulation, tiny-subset overfit, evaluation, checkpoint, resume in a
    new process, export and reload. Memory and time per phase; exit 1 on any FAIL.

    Run it before you rent, and again on the GPU you rented (it re-checks the platform, B1).

    Example: tunepilot pilot campaign.yaml --gpu "A100 80GB"
    """
    from tunepilot.pilot.flow import run_pilot

    run_body(
        lambda: run_pilot(
            open_workspace(args), as_json=as_json, tensors=tensors, gpu=gpu, catalog=catalog
        )
    )


@app.command()
def plan(
    args: CampaignArgs = None,
    gpu: Gpu = None,
    catalog: Catalog = None,
    as_json: JsonFlag = False,
    emit: Annotated[
        str | None,
        typer.Option("--emit", help="Also write a launcher's job file: skypilot "
                     "(launch/skypilot.yaml; run it with `sky jobs launch`)."),
    ] = None,
    nodes: Annotated[
        int, typer.Option("--nodes", min=1, max=1024, help="Machines for the emitted job "
                          "(torchrun over all of them).")
    ] = 1,
) -> None:
    """The per-card sheet (L1) and the 3/7/30-day rental plan (L3), without a GPU: dry runs of
    the campaign's exact step judged on every catalog machine by one verdict (every phase,
    every precision the step computes in, 10% headroom; the phase that decides), the largest
    microbatch with and without activation checkpointing, base dtypes, the fastest layout of a
    multi-GPU machine (side by side, DDP, FSDP), hours from the step's FLOPs and a utilisation
    calibrated on published measurements (low-high range), or from a pilot on that very card.
    Every package starts with the pilot again on the rented card.

    Exit 1 when the card planned for does not PASS: the nearest change that makes it fit is
    printed instead, each candidate a dry run actually executed.

    `--emit skypilot` writes launch/skypilot.yaml: the chosen card, tunepilot's install, and
    the package's phases in order (re-pilot on the card, baseline, runs, compare, export,
    verify), with the campaign folder on a bucket so a preempted job resumes.

    Examples:

      tunepilot plan campaign.yaml --gpu "H100 80GB" --catalog my-prices.yaml

      tunepilot plan campaign.yaml model.name_or_path=llama-3-70b-config --gpu "8x A100 80GB"

      tunepilot plan campaign.yaml --gpu "8x H100 80GB" --emit skypilot --nodes 2
    """
    from tunepilot.pilot.plan import run_plan

    run_body(lambda: run_plan(open_workspace(args), gpu=gpu, as_json=as_json, catalog=catalog,
                              emit=emit, nodes=nodes))


@app.command()
def size(
    args: CampaignArgs = None,
    gpu: Annotated[
        list[str] | None,
        typer.Option("--gpu", help="A card of the GPU catalog to judge the peak against (repeat)."),
    ] = None,
    catalog: Catalog = None,
    as_json: JsonFlag = False,
) -> None:
    """Dry run without a GPU: build the campaign's target architecture from its config.json
    on meta tensors (no weights read), run its first step, steady step, evaluation,
    checkpoint and export, and print each phase's peak bytes (weights, gradients, optimizer
    state, activations, temporaries) and FLOPs. model.name_or_path may be a shipped config
    such as llama-3-8b-config. Each --gpu gets the verdict `plan` gives it (exit 1 when one
    does not PASS).

    Example: tunepilot size campaign.yaml model.name_or_path=llama-3-8b-config --gpu "H100 80GB"
    """
    from tunepilot.sizing.dry_run.flow import run_size

    run_body(lambda: run_size(open_workspace(args), gpus=gpu, as_json=as_json, catalog=catalog))
