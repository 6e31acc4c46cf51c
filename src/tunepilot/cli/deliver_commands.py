"""Delivering: export, verify, the dossier, and the demo that runs the whole chain."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunepilot.cli.app import CampaignArgs, JsonFlag, app, open_workspace, run_body

# ---------------------------------------------------------------------------------------------
# deliver: export, verify
# ---------------------------------------------------------------------------------------------


@app.command()
def export(
    run_id: Annotated[str, typer.Argument(help="A completed run, e.g. lr-2e-4-s0-1.")],
    args: CampaignArgs = None,
    out: Annotated[Path | None, typer.Option(
        help="Bundle folder (default exports/RUN); a relative path is inside the campaign."
    )] = None,
    merge: Annotated[
        bool, typer.Option("--merge", help="Also write the adapter merged into its base "
                           "(merged/, safetensors, the base's dtype).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Write a bundle a colleague can load without tunepilot: adapter (PEFT format) or model,
    tokenizer, resolved campaign, base id + revision + weight hashes, environment, metrics,
    control inputs, MANIFEST.json and a README that is a Hub model card (P4, R3).

    Example: tunepilot export control-s0-1 campaign.yaml --merge
    """
    from tunepilot.deliver.flow import export_command

    run_body(lambda: export_command(open_workspace(args), run_id, out, as_json, merge))


@app.command()
def verify(
    bundle: Annotated[Path, typer.Argument(help="An export folder.")],
    base: Annotated[
        Path | None, typer.Option(help="Your copy of the base model, if it moved.")
    ] = None,
    expect: Annotated[
        str | None,
        typer.Option("--expect", help="The bundle's pinned sha256 (of MANIFEST.json), as "
                     "printed by export and kept in the ledger; any other bundle FAILs."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """In a new process: check every hash, refuse pickles, load with plain transformers/peft,
    replay the control inputs and compare (R2, R4). Exit 1 when anything differs. The
    MANIFEST proves files are intact, not who wrote them: pin the bundle with --expect.

    Examples:

      tunepilot verify exports/control-s0-1

      tunepilot verify exports/control-s0-1 --expect 3f5a...  # the sha256 export printed
    """
    from tunepilot.deliver.verify import verify_command

    run_body(lambda: verify_command(bundle, as_json, base, expect))


@app.command()
def report(
    args: CampaignArgs = None,
    as_json: JsonFlag = False,
    open_browser: Annotated[
        bool, typer.Option("--open", help="Open the dossier in the system browser.")
    ] = False,
) -> None:
    """Write one self-contained HTML dossier a colleague can re-read months later: hypothesis,
    data audit, pilot gates, sizing, plan, every run, curves, comparison, per-class charts,
    test looks, notebook, exports and observed limits (L4, L5).

    Example: tunepilot report campaign.yaml --open
    """
    from tunepilot.report.flow import report_command

    run_body(lambda: report_command(open_workspace(args), open_browser, as_json))


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------


@app.command()
def demo(
    directory: Annotated[Path, typer.Argument(help="Where to write the demo campaign.")] = Path(
        "demo-campaign"
    ),
    task: Annotated[
        str, typer.Option(help="classification | extraction | image (handwritten digits)")
    ] = "classification",
    quick: Annotated[
        bool,
        typer.Option("--quick", help="Tiny model, tiny budget: checks the wiring in about 30 s."),
    ] = False,
) -> None:
    """Generate the demo ticket data and campaign, then run the whole chain on embedded
    defaults: audit, baseline, pilot, plan, the learning-rate sweep, compare, export, verify
    and the HTML report. Each demo ends with a verified bundle and exits 0, or says which
    step failed and exits 1.

    Wall times measured on a quiet 2-core machine, each ending with a verified bundle: the
    full classification demo (6 MiniLM runs of 120 updates of 8 tickets) 2 min 22 s, --quick
    29 s, --task extraction 62 s, --task image 42 s. `python benchmarks/bench_demo_time.py`
    measures every demo (wall, CPU, outcome) on yours; the progress line says which run of the
    sweep is training ("run 2 of 6").

    Examples:

      tunepilot demo demo-campaign

      tunepilot demo demo-extraction --task extraction

      tunepilot demo demo-images --task image --quick

      tunepilot demo /tmp/smoke --quick
    """

    def body() -> int:
        from tunepilot.demo.campaign import run_demo

        if task not in ("classification", "extraction", "image"):
            from tunepilot.errors import input_error

            raise input_error(
                "--task", f"unknown demo task `{task}`", "use classification, extraction or image"
            )
        return run_demo(directory, task, quick)

    run_body(body)


# ---------------------------------------------------------------------------------------------
# backups: archive, restore (L4)
# ---------------------------------------------------------------------------------------------


@app.command()
def archive(
    campaign: Annotated[
        Path, typer.Argument(help="The campaign file or its folder.")
    ] = Path("campaign.yaml"),
    dest: Annotated[
        Path | None,
        typer.Argument(help="The archive file (.tar, .tar.gz, .tgz) or a folder for it "
                       "(default: beside the campaign folder, named after it and the time)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Write the whole campaign folder into one verified archive: the ledger (a consistent
    snapshot, taken with SQLite's backup API while runs may write), data versions, runs and
    checkpoints, pilots, exports, the dossier, and a manifest with every file's sha256. Prints
    the manifest's sha256, for `restore --expect` (L4).

    Examples:

      tunepilot archive my-campaign/campaign.yaml

      tunepilot archive my-campaign /mnt/backup/my-campaign-day3.tar.gz
    """
    from tunepilot.deliver.archive import archive_command

    run_body(lambda: archive_command(campaign, dest, as_json))


@app.command()
def restore(
    archive_file: Annotated[
        Path, typer.Argument(help="An archive written by `tunepilot archive`.")
    ],
    directory: Annotated[Path, typer.Argument(help="A new (or empty) folder to restore into.")],
    expect: Annotated[
        str | None,
        typer.Option("--expect", help="The archive's manifest sha256, as `archive` printed it; "
                     "any other archive is refused."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Verify an archive file by file against its manifest, then restore the campaign folder
    into DIRECTORY; a damaged or changed archive restores nothing (exit 2). Runs that were
    training when it was made are marked interrupted, with the command that resumes them.

    Examples:

      tunepilot restore my-campaign-20261202-101500.tar my-campaign-restored

      tunepilot restore day3.tar.gz /work/again --expect 9c1d...  # the sha256 archive printed
    """
    from tunepilot.deliver.restore import restore_command

    run_body(lambda: restore_command(archive_file, directory, expect, as_json))
