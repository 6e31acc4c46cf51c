"""Experiments: baseline, run, resume, amend, runs, note, compare, the sealed test."""

from __future__ import annotations

from typing import Annotated

import typer

from tunepilot.cli.app import CampaignArgs, JsonFlag, app, open_workspace, run_body

# ---------------------------------------------------------------------------------------------
# experiments: baseline, run, resume, runs, note
# ---------------------------------------------------------------------------------------------


@app.command()
def baseline(args: CampaignArgs = None, as_json: JsonFlag = False) -> None:
    """Evaluate the starting model on the validation split before any training (H3) and fix
    the hypothesis in the ledger (H1). Predictions per example are kept.

    Example: tunepilot baseline campaign.yaml
    """
    from tunepilot.experiments import flow as run_flow

    run_body(lambda: run_flow.baseline(open_workspace(args), as_json))


Nproc = Annotated[
    int | None,
    typer.Option("--nproc", min=1, help="Data replicas per run, launched with torchrun."),
]
TorchrunArgs = Annotated[
    list[str] | None,
    typer.Option("--torchrun-arg", help="Passed to torchrun, e.g. --torchrun-arg=--nnodes=2."),
]

Jobs = Annotated[
    int | None, typer.Option(min=1, help="Run N independent runs side by side (one per GPU).")
]
Retry = Annotated[
    str | None,
    typer.Option("--retry", help="Run a failed or interrupted run again under a new id."),
]
FromStep = Annotated[
    str | None,
    typer.Option("--from", help="Resume from this checkpoint (step-N) instead of the newest."),
]


@app.command("run")
def run_command(
    args: CampaignArgs = None,
    as_json: JsonFlag = False,
    variant: Annotated[
        list[str] | None, typer.Option("--variant", "-v", help="Variant(s) to run; default all.")
    ] = None,
    seeds: Annotated[
        str | None, typer.Option(help="Comma-separated seeds; default the campaign's.")
    ] = None,
    stop_after: Annotated[
        int | None,
        typer.Option("--stop-after", min=1, help="Pause each run after N updates (resume later)."),
    ] = None,
    nproc: Nproc = None,
    strategy: Annotated[
        str | None, typer.Option(help="ddp | fsdp (default: the campaign's).")
    ] = None,
    jobs: Jobs = None,
    torchrun_arg: TorchrunArgs = None,
    retry: Retry = None,
) -> None:
    """Train variants x seeds; every run gets an id, a folder and a ledger line (V1-V6).

    Examples:

      tunepilot run campaign.yaml

      tunepilot run campaign.yaml --variant control --variant lr-2e-4 --seeds 0,1

      tunepilot run campaign.yaml --nproc 2 --strategy fsdp

      tunepilot run campaign.yaml model.method=full training.weights_dtype=bf16
      training.optimizer=adamw_bf16_states

      tunepilot run campaign.yaml --jobs 2

      tunepilot run campaign.yaml --retry lr-2e-4-s1-1
    """
    from tunepilot.experiments import flow as run_flow

    run_body(
        lambda: run_flow.run_any(
            open_workspace(args),
            variant,
            seeds,
            stop_after,
            as_json,
            nproc=nproc,
            strategy=strategy,
            jobs=jobs,
            torchrun_args=torchrun_arg,
            retry_of=retry,
        )
    )


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue, e.g. control-s0-1.")],
    args: CampaignArgs = None,
    as_json: JsonFlag = False,
    stop_after: Annotated[
        int | None,
        typer.Option("--stop-after", min=1, help="Pause again after N updates in all."),
    ] = None,
    nproc: Nproc = None,
    torchrun_arg: TorchrunArgs = None,
    from_step: FromStep = None,
    expect: Annotated[
        str | None,
        typer.Option("--expect", help="Resume only from the checkpoint whose MANIFEST.json has "
                     "this sha256 (`sha256sum runs/RUN/checkpoints/step-N/MANIFEST.json`, taken "
                     "when it was written); refuse otherwise."),
    ] = None,
    allow_backend_change: Annotated[
        bool,
        typer.Option("--allow-backend-change", "--allow",
                     help="Resume on another backend (torch build or card) than the run "
                     "trained on; the run is then marked as run on both (B1)."),
    ] = False,
) -> None:
    """Continue a run from its newest checkpoint that verifies (a newer one that does not is
    named and skipped) in this new process: same step, lr, data position and generators, so
    the curve continues exactly (R1). A run resumes on the backend it trained on: another
    CUDA/ROCm/CPU build or card is refused (exit 2) unless --allow-backend-change.

    Examples:

      tunepilot resume control-s0-1 campaign.yaml

      tunepilot resume control-s0-1 campaign.yaml --from step-000100

      tunepilot resume control-s0-1 campaign.yaml --expect 3f5a...  # a pinned checkpoint

    A checkpoint's MANIFEST.json proves its files are intact, not who wrote them: weights
    edited together with a rewritten MANIFEST verify. Pin the checkpoint with --expect.

      tunepilot resume control-s0-1 campaign.yaml --allow-backend-change
    """
    from tunepilot.experiments import flow as run_flow

    run_body(
        lambda: run_flow.resume_any(
            open_workspace(args), run_id, stop_after, as_json, nproc, torchrun_arg, from_step,
            expect, allow_backend_change,
        )
    )


@app.command()
def amend(
    reason: Annotated[str, typer.Argument(help="Why the hypothesis or its guards changed.")],
    args: CampaignArgs = None,
) -> None:
    """Record the campaign's edited hypothesis and guards as an amendment with its reason;
    the original stays beside it in the ledger and the report (H1).

    Example: tunepilot amend "billing and refunds merged into one queue" campaign.yaml
    """
    from tunepilot.experiments import flow as run_flow

    run_body(lambda: run_flow.amend(open_workspace(args), reason))


@app.command()
def runs(args: CampaignArgs = None, as_json: JsonFlag = False) -> None:
    """List every run of the campaign with its status and reason, failures included (V3).

    Example: tunepilot runs campaign.yaml --json
    """
    from tunepilot.experiments import flow as run_flow

    run_body(lambda: run_flow.list_runs(open_workspace(args), as_json))


@app.command()
def note(
    text: Annotated[str, typer.Argument(help="The decision or observation.")],
    args: CampaignArgs = None,
    run_id: Annotated[str | None, typer.Option("--run", help="Attach it to a run.")] = None,
) -> None:
    """Write a timestamped entry in the campaign notebook (L4).

    Example: tunepilot note "lr 2e-4 diverges after warmup; keep 1e-4" campaign.yaml
    """
    from tunepilot.experiments import flow as run_flow

    run_body(lambda: run_flow.note(open_workspace(args), text, run_id))


@app.command()
def compare(args: CampaignArgs = None, as_json: JsonFlag = False) -> None:
    """Variants vs the control across seeds: mean and std, a paired bootstrap interval on
    per-example scores, per-class deltas, guards against the baseline and the control, every
    diverged or interrupted run with its reason, and a decision (V5-V7, H2).

    Example: tunepilot compare campaign.yaml --json
    """
    from tunepilot.experiments.compare import compare_command
    from tunepilot.experiments.flow import check_hypothesis_before

    run_body(lambda: compare_command(check_hypothesis_before(open_workspace(args)), as_json))


@app.command("test")
def test_command(
    final: Annotated[
        str, typer.Option("--final", help="The run (or `baseline`) to evaluate on the test split.")
    ],
    args: CampaignArgs = None,
    as_json: JsonFlag = False,
) -> None:
    """Evaluate one run on the sealed test split. Every look is counted; a second look warns
    loudly, or is refused when test_policy.on_second_look is `refuse` (H4).

    Example: tunepilot test --final lr-2e-4-s0-1 campaign.yaml
    """
    from tunepilot.experiments.sealed_test import final_test

    run_body(lambda: final_test(open_workspace(args), final, as_json))
