"""The `tunepilot` command: parse, call one function, print.

Exit codes everywhere: 0 ok (PASS/WARN), 1 a check FAILed, 2 bad input or usage.
Nothing heavy is imported at module level: `tunepilot --help` and `tunepilot validate` never
import torch, transformers or peft.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunepilot import __version__

EXAMPLES = """
Examples:

  tunepilot demo                                   # the whole chain on generated tickets
  tunepilot init my-campaign --task classification # a commented campaign to edit
  tunepilot validate my-campaign/campaign.yaml training.lr=5e-5
  tunepilot data audit my-campaign/campaign.yaml --json
  tunepilot data show my-campaign/campaign.yaml -n 3 --per-class 1
  tunepilot schema > campaign.schema.json
"""

app = typer.Typer(
    name="tunepilot",
    help="One complete step before a thousand attempts: check a fine-tuning campaign before "
    "you rent the GPU, run it, and deliver a result a colleague can re-read.\n\n" + EXAMPLES,
    no_args_is_help=True,
    rich_markup_mode=None,
    add_completion=False,
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(
    help="Load, audit and inspect the campaign's data (D1-D8).\n\n"
    "Examples:\n\n  tunepilot data audit campaign.yaml\n\n"
    "  tunepilot data show campaign.yaml --split validation -n 2 --json",
    no_args_is_help=True,
)
app.add_typer(data_app, name="data")

CampaignArgs = Annotated[
    list[str] | None,
    typer.Argument(
        help="The campaign file (default: campaign.yaml), then any dotted overrides "
        "such as training.lr=5e-5 or data.max_length=256.",
        show_default=False,
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON only.")]


def _split_campaign_args(args: list[str] | None) -> tuple[Path, list[str]]:
    """`[campaign.yaml] [key=value ...]` -> (path, overrides)."""
    args = list(args or [])
    path = Path("campaign.yaml")
    if args and "=" not in args[0]:
        path = Path(args.pop(0))
    extra = [a for a in args if "=" not in a]
    if extra:
        from tunepilot.errors import InputError, Problem

        raise InputError(
            [
                Problem(a, "not a key=value override", "write overrides as key.path=value")
                for a in extra
            ],
            title="invalid arguments",
        )
    return path, args


def _run(func, *args, **kwargs) -> None:
    """Call a command body; bad input exits 2 with every problem listed."""
    from tunepilot.errors import InputError

    try:
        code = func(*args, **kwargs)
    except InputError as err:
        from tunepilot.console import print_input_error

        print_input_error(err)
        raise typer.Exit(2) from None
    raise typer.Exit(code or 0)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tunepilot {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """tunepilot command line."""


# ---------------------------------------------------------------------------------------------
# campaign file
# ---------------------------------------------------------------------------------------------


@app.command()
def validate(args: CampaignArgs = None, as_json: JsonFlag = False) -> None:
    """Check a campaign file without training anything: every problem at once, each with its
    key path, what was found and the fix. Never imports torch.

    Example: tunepilot validate campaign.yaml training.lr=5e-5
    """

    def body() -> int:
        from tunepilot.campaign import load_campaign
        from tunepilot.campaign.checks import raise_on_problems
        from tunepilot.console import console, print_json

        path, overrides = _split_campaign_args(args)
        campaign = load_campaign(path, overrides)
        raise_on_problems(campaign, path.resolve().parent, str(path))
        if as_json:
            print_json(
                {
                    "ok": True,
                    "campaign": campaign.model_dump(mode="json"),
                    "config_hash": campaign.config_hash(),
                }
            )
        else:
            t = campaign.training
            console.print(
                f"[bold green]ok[/] {path}: campaign [bold]{campaign.name}[/], task "
                f"{campaign.hypothesis.task}, model {campaign.model.name_or_path} "
                f"({campaign.model.method}), {len(campaign.variants)} variant(s) x "
                f"{len(campaign.seeds)} seed(s), microbatch {t.microbatch} x accumulation "
                f"{t.accumulation}, config hash {campaign.config_hash()}"
            )
        return 0

    _run(body)


@app.command()
def schema() -> None:
    """Print the campaign file's JSON Schema (point your editor's YAML plugin at it).

    Example: tunepilot schema > campaign.schema.json
    """
    from tunepilot.campaign import json_schema
    from tunepilot.console import print_json

    print_json(json_schema())


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="Folder for the new campaign.")],
    task: Annotated[
        str, typer.Option(help="classification | extraction | format")
    ] = "classification",
    force: Annotated[bool, typer.Option(help="Overwrite an existing campaign.yaml.")] = False,
) -> None:
    """Write a commented campaign.yaml that starts with the command that runs it.

    Example: tunepilot init tickets --task classification
    """

    def body() -> int:
        from tunepilot.console import console
        from tunepilot.templates import write_template

        path = write_template(directory, task, force=force)
        console.print(f"wrote {path}\nnext: [bold]tunepilot validate {path}[/]")
        return 0

    _run(body)


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------


@data_app.command("audit")
def data_audit(
    args: CampaignArgs = None,
    as_json: JsonFlag = False,
    no_tokenizer: Annotated[
        bool, typer.Option("--no-tokenizer", help="Skip the token-length and truncation checks.")
    ] = False,
) -> None:
    """Audit the campaign's data: duplicates, near-duplicates, leakage by group or time,
    labels, class balance, label mapping and truncation. Exit 1 when a check FAILs.

    Example: tunepilot data audit campaign.yaml data.split.policy=group
    """

    def body() -> int:
        from tunepilot.data_flow import audit_workspace
        from tunepilot.workspace import Workspace

        path, overrides = _split_campaign_args(args)
        return audit_workspace(Workspace.open(path, overrides), as_json, not no_tokenizer)

    _run(body)


@data_app.command("show")
def data_show(
    args: CampaignArgs = None,
    n: Annotated[int, typer.Option("-n", help="Examples to show.")] = 3,
    per_class: Annotated[
        int, typer.Option("--per-class", help="Also show K examples of each class (D4).")
    ] = 0,
    split: Annotated[str, typer.Option(help="train | validation | test")] = "train",
    as_json: JsonFlag = False,
) -> None:
    """Show examples after the exact encoding the trainer uses: tokens, separators, the
    positions that carry loss, the truncation point and the expected target (D3-D5).

    Example: tunepilot data show campaign.yaml -n 2 --per-class 1 --split validation
    """

    def body() -> int:
        from tunepilot.data_flow import show_workspace
        from tunepilot.workspace import Workspace

        path, overrides = _split_campaign_args(args)
        return show_workspace(Workspace.open(path, overrides), split, n, per_class, as_json)

    _run(body)


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
    as_json: JsonFlag = False,
    tensors: Annotated[
        bool, typer.Option("--tensors", help="Also measure tensor bytes (PyTorch profiler).")
    ] = False,
    gpu: Gpu = None,
    catalog: Catalog = None,
) -> None:
    """Run every operation of the campaign once, each as a gate that ends PASS, WARN or FAIL
    with what was seen and what to do: environment, data, inspect, load, update audit, first
    step, steady step, accumulation, tiny-subset overfit, evaluation, checkpoint, resume in a
    new process, export and reload. Memory and time per phase; exit 1 on any FAIL.

    Run it before you rent, and again on the GPU you rented (it re-checks the platform, B1).

    Example: tunepilot pilot campaign.yaml --gpu "A100 80GB"
    """
    from tunepilot.pilot.flow import run_pilot

    _run(lambda: run_pilot(_workspace(args), as_json=as_json, tensors=tensors, gpu=gpu,
                           catalog=catalog))


@app.command()
def plan(
    args: CampaignArgs = None,
    gpu: Gpu = None,
    catalog: Catalog = None,
    as_json: JsonFlag = False,
) -> None:
    """The selection sheet (L1) and the 3/7/30-day rental plan (L3) from the latest pilot's
    measurements and a fitted memory model (its held-out error is printed).

    Example: tunepilot plan campaign.yaml --gpu "H100 80GB" --catalog my-prices.yaml
    """
    from tunepilot.pilot.flow import run_plan

    _run(lambda: run_plan(_workspace(args), gpu=gpu, as_json=as_json, catalog=catalog))


# ---------------------------------------------------------------------------------------------
# experiments: baseline, run, resume, runs, note
# ---------------------------------------------------------------------------------------------


def _workspace(args: list[str] | None):
    from tunepilot.workspace import Workspace

    path, overrides = _split_campaign_args(args)
    return Workspace.open(path, overrides)


@app.command()
def baseline(args: CampaignArgs = None, as_json: JsonFlag = False) -> None:
    """Evaluate the starting model on the validation split before any training (H3) and fix
    the hypothesis in the ledger (H1). Predictions per example are kept.

    Example: tunepilot baseline campaign.yaml
    """
    from tunepilot import run_flow

    _run(lambda: run_flow.baseline(_workspace(args), as_json))


Nproc = Annotated[
    int | None, typer.Option("--nproc", help="Data replicas per run, launched with torchrun.")
]
TorchrunArgs = Annotated[
    list[str] | None,
    typer.Option("--torchrun-arg", help="Passed to torchrun, e.g. --torchrun-arg=--nnodes=2."),
]


@app.command("run")
def run_command(
    args: CampaignArgs = None,
    variant: Annotated[
        list[str] | None, typer.Option("--variant", "-v", help="Variant(s) to run; default all.")
    ] = None,
    seeds: Annotated[
        str | None, typer.Option(help="Comma-separated seeds; default the campaign's.")
    ] = None,
    stop_after: Annotated[
        int | None,
        typer.Option("--stop-after", help="Pause each run after N updates (resume later)."),
    ] = None,
    nproc: Nproc = None,
    strategy: Annotated[
        str | None, typer.Option(help="ddp | fsdp (default: the campaign's).")
    ] = None,
    jobs: Annotated[
        int | None, typer.Option(help="Run N independent runs side by side (one per GPU).")
    ] = None,
    torchrun_arg: TorchrunArgs = None,
    retry: Annotated[
        str | None,
        typer.Option("--retry", help="Run a failed or interrupted run again under a new id."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Train variants x seeds; every run gets an id, a folder and a ledger line (V1-V6).

    Examples:

      tunepilot run campaign.yaml

      tunepilot run campaign.yaml --variant control --variant lr-2e-4 --seeds 0,1

      tunepilot run campaign.yaml --nproc 2 --strategy fsdp

      tunepilot run campaign.yaml --jobs 2

      tunepilot run campaign.yaml --retry lr-2e-4-s1-1
    """
    from tunepilot import run_flow

    _run(lambda: run_flow.run_any(
        _workspace(args), variant, seeds, stop_after, as_json, nproc=nproc, strategy=strategy,
        jobs=jobs, torchrun_args=torchrun_arg, retry_of=retry))


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue, e.g. control-s0-1.")],
    args: CampaignArgs = None,
    stop_after: Annotated[
        int | None, typer.Option("--stop-after", help="Pause again after N updates in all.")
    ] = None,
    nproc: Nproc = None,
    torchrun_arg: TorchrunArgs = None,
    as_json: JsonFlag = False,
) -> None:
    """Continue a run from its latest checkpoint in this new process: same step, lr, data
    position and generators, so the curve continues exactly (R1).

    Example: tunepilot resume control-s0-1 campaign.yaml
    """
    from tunepilot import run_flow

    _run(lambda: run_flow.resume_any(_workspace(args), run_id, stop_after, as_json, nproc,
                                     torchrun_arg))


@app.command()
def amend(
    reason: Annotated[str, typer.Argument(help="Why the hypothesis or its guards changed.")],
    args: CampaignArgs = None,
) -> None:
    """Record the campaign's edited hypothesis and guards as an amendment with its reason;
    the original stays beside it in the ledger and the report (H1).

    Example: tunepilot amend "billing and refunds merged into one queue" campaign.yaml
    """
    from tunepilot import run_flow

    _run(lambda: run_flow.amend(_workspace(args), reason))


@app.command()
def runs(args: CampaignArgs = None, as_json: JsonFlag = False) -> None:
    """List every run of the campaign with its status and reason, failures included (V3).

    Example: tunepilot runs campaign.yaml --json
    """
    from tunepilot import run_flow

    _run(lambda: run_flow.list_runs(_workspace(args), as_json))


@app.command()
def note(
    text: Annotated[str, typer.Argument(help="The decision or observation.")],
    args: CampaignArgs = None,
    run_id: Annotated[str | None, typer.Option("--run", help="Attach it to a run.")] = None,
) -> None:
    """Write a timestamped entry in the campaign notebook (L4).

    Example: tunepilot note "lr 2e-4 diverges after warmup; keep 1e-4" campaign.yaml
    """
    from tunepilot import run_flow

    _run(lambda: run_flow.note(_workspace(args), text, run_id))


@app.command()
def compare(args: CampaignArgs = None, as_json: JsonFlag = False) -> None:
    """Variants vs the control across seeds: mean and std, a paired bootstrap interval on
    per-example scores, per-class deltas, guards against the baseline and the control, every
    diverged or interrupted run with its reason, and a decision (V5-V7, H2).

    Example: tunepilot compare campaign.yaml --json
    """
    from tunepilot.compare import compare_command
    from tunepilot.run_flow import check_hypothesis_before

    _run(lambda: compare_command(check_hypothesis_before(_workspace(args)), as_json))


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
    from tunepilot.sealed_test import final_test

    _run(lambda: final_test(_workspace(args), final, as_json))


# ---------------------------------------------------------------------------------------------
# deliver: export, verify
# ---------------------------------------------------------------------------------------------


@app.command()
def export(
    run_id: Annotated[str, typer.Argument(help="A completed run, e.g. lr-2e-4-s0-1.")],
    args: CampaignArgs = None,
    out: Annotated[Path | None, typer.Option(help="Bundle folder (default exports/RUN).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Write a bundle a colleague can load without tunepilot: adapter (PEFT format) or model,
    tokenizer, resolved campaign, base id + revision + weight hashes, environment, metrics,
    control inputs, README and MANIFEST.json (P4, R3).

    Example: tunepilot export control-s0-1 campaign.yaml
    """
    from tunepilot.verify import export_command

    _run(lambda: export_command(_workspace(args), run_id, out, as_json))


@app.command()
def verify(
    bundle: Annotated[Path, typer.Argument(help="An export folder.")],
    base: Annotated[
        Path | None, typer.Option(help="Your copy of the base model, if it moved.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """In a new process: check every hash, refuse pickles, load with plain transformers/peft,
    replay the control inputs and compare (R2, R4). Exit 1 when anything differs.

    Example: tunepilot verify exports/control-s0-1
    """
    from tunepilot.verify import verify_command

    _run(lambda: verify_command(bundle, as_json, base))


@app.command()
def report(
    args: CampaignArgs = None,
    open_browser: Annotated[
        bool, typer.Option("--open", help="Open the dossier in the system browser.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Write one self-contained HTML dossier a colleague can re-read months later: hypothesis,
    data audit, pilot gates, sizing, plan, every run, curves, comparison, per-class charts,
    test looks, notebook, exports and observed limits (L4, L5).

    Example: tunepilot report campaign.yaml --open
    """
    from tunepilot.report.flow import report_command

    _run(lambda: report_command(_workspace(args), open_browser, as_json))


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------


@app.command()
def demo(
    directory: Annotated[Path, typer.Argument(help="Where to write the demo campaign.")] = Path(
        "demo-campaign"
    ),
    task: Annotated[str, typer.Option(help="classification | extraction")] = "classification",
    quick: Annotated[
        bool, typer.Option("--quick", help="Tiny model, tiny budget: checks the wiring in ~1 min.")
    ] = False,
) -> None:
    """Generate the demo ticket data and campaign, then run the whole chain on embedded
    defaults: audit, baseline, pilot, plan, the learning-rate sweep, compare, export, verify
    and the HTML report.

    Examples:

      tunepilot demo demo-campaign

      tunepilot demo demo-extraction --task extraction

      tunepilot demo /tmp/smoke --quick
    """

    def body() -> int:
        from tunepilot.demo.campaign import run_demo

        if task not in ("classification", "extraction"):
            from tunepilot.errors import input_error

            raise input_error("--task", f"unknown demo task `{task}`",
                              "use classification or extraction")
        return run_demo(directory, task, quick)

    _run(body)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
