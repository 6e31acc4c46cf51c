"""The `tunepilot` app and what every command shares: campaign arguments, exit codes.

Exit codes everywhere: 0 ok (PASS/WARN), 1 a check FAILed, 2 bad input or usage.
Nothing heavy is imported at module level: `tunepilot --help` and `tunepilot validate` never
import torch, transformers or peft.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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


def split_campaign_args(args: list[str] | None) -> tuple[Path, list[str]]:
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


def run_body(func, *args, **kwargs) -> None:
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


def open_workspace(args: list[str] | None) -> Any:
    """The campaign file and overrides of a command, opened as a Workspace."""
    from tunepilot.data.workspace import Workspace

    path, overrides = split_campaign_args(args)
    return Workspace.open(path, overrides)
