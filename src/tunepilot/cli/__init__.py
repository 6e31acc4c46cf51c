"""The `tunepilot` command: parse, call one function, print.

Exit codes everywhere: 0 ok (PASS/WARN), 1 a check FAILed, 2 bad input or usage. Nothing heavy
is imported here: `tunepilot --help` and `tunepilot validate` never import torch,
transformers or peft. Each module below registers its commands on the one app, in the order a
campaign uses them (the order of `--help`).
"""

# isort: off
from tunepilot.cli import setup_commands  # noqa: F401
from tunepilot.cli import rental_commands  # noqa: F401
from tunepilot.cli import experiment_commands  # noqa: F401
from tunepilot.cli import deliver_commands  # noqa: F401

# isort: on
from tunepilot.cli.app import app


def main() -> None:
    """Console-script entry point. Under `--json` a usage error caught before any command runs
    (an unknown option, a value outside its range) still answers with one JSON document."""
    import sys

    if "--json" not in sys.argv[1:]:
        app()
        return
    import typer

    from tunepilot.cli.app import usage_error_json

    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        sys.exit(1)
    except typer.TyperException as exc:  # click's usage errors, as typer bundles click
        usage_error_json(exc)
        sys.exit(int(getattr(exc, "exit_code", 2)))
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]
