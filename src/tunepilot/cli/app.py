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

# "\b" alone on a line tells click not to rewrap the paragraph after it: one example a line.
EXAMPLES = """
Examples:

\b
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
_json_mode = {"on": False}  # set while --json is parsed, read by run_body


def _note_json(value: bool) -> bool:
    """Remember `--json` for `run_body`, which answers in JSON even on errors."""
    _json_mode["on"] = bool(value)
    return value


JsonFlag = Annotated[
    bool,
    typer.Option("--json", callback=_note_json, help="Print one JSON document on stdout only."),
]


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
    """Call a command body and turn what happened into the exit code (README: exit codes).

    0: every check passed or warned; 1: the command did its work and a check FAILed (the output
    says which); 2: bad input or usage, every problem listed with where it is and the fix;
    3: tunepilot itself failed: one sentence on stderr and the path of the full traceback, never
    a traceback on the terminal. With `--json`, stdout holds exactly one JSON document, errors
    included; everything else goes to stderr.
    """
    from tunepilot.console import json_stdout

    if not _json_mode["on"]:
        raise typer.Exit(_outcome(func, args, kwargs, as_json=False))
    with json_stdout() as channel:
        code = _outcome(func, args, kwargs, as_json=True)
        if not channel.written:  # a path that reports in words only still answers in JSON
            from tunepilot.console import print_json

            print_json({"exit_code": code})
    raise typer.Exit(code)


def _outcome(func, args, kwargs, *, as_json: bool) -> int:
    from tunepilot.console import error_console, print_input_error, print_json
    from tunepilot.errors import InputError, Stopped, storage_error

    try:
        try:
            return int(func(*args, **kwargs) or 0)
        except (InputError, Stopped, typer.Exit, KeyboardInterrupt):
            raise
        except Exception as exc:  # a full disk wherever it strikes is a sentence, not a fault
            fault = storage_error(exc, _written_path(exc))
            if fault is None:
                raise
            raise fault from None
    except InputError as err:
        print_input_error(err)
        if as_json:
            print_json({"exit_code": 2, "error": err.title,
                        "problems": [vars(p) for p in err.problems]})  # fmt: skip
        return 2
    except Stopped as stop:  # SIGTERM / Ctrl-C: state saved; exit as that signal would
        error_console.print(f"[yellow]stopped:[/] {stop.message}", highlight=False)
        if as_json:
            print_json({"exit_code": stop.exit_code, "stopped": stop.message})
        return stop.exit_code
    except (typer.Exit, KeyboardInterrupt):
        raise
    except Exception as exc:  # last resort: a sentence and a file, never a traceback
        path = _write_traceback(exc)
        error_console.print(
            f"[bold red]error:[/] tunepilot stopped on an unexpected {type(exc).__name__}: "
            f"{str(exc)[:300]}. This is a fault in tunepilot or its environment, not in your "
            f"campaign; the full traceback is in {path} (attach it when you report it).",
            highlight=False,
        )
        if as_json:
            print_json({"exit_code": 3, "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                        "traceback_file": str(path)})  # fmt: skip
        return 3


def usage_error_json(exc: Any) -> None:
    """A click usage error under `--json`: the usual message on stderr, and on stdout the one
    JSON document every `--json` answer is, with the option, what was wrong and the fix."""
    from typer import rich_utils

    from tunepilot.console import print_json

    rich_utils.rich_format_error(exc)
    param = getattr(exc, "param", None)
    where = (getattr(exc, "param_hint", None) or (param and "/".join(param.opts))
             or getattr(exc, "option_name", None) or "command line")  # fmt: skip
    command = getattr(getattr(exc, "ctx", None), "command_path", "tunepilot")
    print_json({"exit_code": exc.exit_code, "error": "usage",
                "problems": [{"where": str(where), "found": exc.format_message(),
                              "fix": f"see `{command} --help`"}]})  # fmt: skip


def _written_path(exc: BaseException) -> Path:
    """The file a storage fault names (its OSError's, or one it was raised from), else the
    current folder. Every tunepilot write goes through `errors.write_text_atomic` or
    `errors.writing`, which name their file; this is the net for any other writer."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.filename:
            return Path(seen.filename)
        seen = seen.__cause__ or seen.__context__
    return Path.cwd()


def _write_traceback(exc: BaseException) -> Path:
    """The full traceback in a file of its own, so the terminal shows one sentence."""
    import os
    import tempfile
    import time
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    stamp = time.strftime("%Y%m%dT%H%M%S")
    path = Path(tempfile.gettempdir()) / f"tunepilot-traceback-{stamp}-{os.getpid()}.txt"
    path.write_text(text, encoding="utf-8")
    return path


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
    _json_mode["on"] = False  # a command without --json never inherits an earlier one's


def open_workspace(args: list[str] | None) -> Any:
    """The campaign file and overrides of a command, opened as a Workspace."""
    from tunepilot.data.workspace import Workspace

    path, overrides = split_campaign_args(args)
    return Workspace.open(path, overrides)
