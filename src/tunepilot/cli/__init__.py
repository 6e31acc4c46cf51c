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
    """Console-script entry point."""
    app()


__all__ = ["app", "main"]
