"""How tunepilot talks to a terminal: findings tables, input errors, JSON output.

One place for presentation so every command prints verdicts the same way. Rich only; nothing
heavy is imported here.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape  # user text such as `[bogus]` or `[refund] ...` is not markup
from rich.table import Table

from tunepilot.errors import InputError
from tunepilot.verdict import Finding, Verdict

WIDE = 200
"""Columns for output sent to a file or a pipe (`nohup`, `tee`, CI logs). Such a stream has no
width and Rich would assume 80, squeezing a wide table until a text column vanishes and ids are
cut; a log is read in an editor or a browser, where long lines cost nothing. COLUMNS wins."""


def _width(stream: Any) -> int | None:
    isatty = getattr(stream, "isatty", None)
    return None if os.environ.get("COLUMNS") or (isatty and isatty()) else WIDE


console = Console(width=_width(sys.stdout))
error_console = Console(stderr=True, width=_width(sys.stderr))

VERDICT_STYLE = {Verdict.PASS: "bold green", Verdict.WARN: "bold yellow", Verdict.FAIL: "bold red"}


def warn(text: str) -> None:
    """One warning line on stderr: what the user should know, never a stop."""
    error_console.print(f"[bold yellow]warning:[/] {text}", highlight=False)


def print_input_error(err: InputError) -> None:
    """Every problem on its own line: where, what was found, the fix.

    Soft-wrapped: a terminal folds a long line for the eye, but no newline is ever inserted, so
    a path or a key copied from the message (or grepped from a log) stays whole at any width.
    """
    error_console.print(f"[bold red]error:[/] {escape(err.title)} ({len(err.problems)} "
                        "problem(s))")  # fmt: skip
    for problem in err.problems:
        error_console.print(
            f"  [bold]{escape(problem.where)}[/]: {escape(problem.found)}", highlight=False,
            soft_wrap=True,
        )  # fmt: skip
        error_console.print(f"    [cyan]fix:[/] {escape(problem.fix)}", highlight=False,
                            soft_wrap=True)  # fmt: skip


def findings_table(findings: list[Finding], title: str) -> Table:
    table = Table(title=title, show_lines=False, expand=True)
    table.add_column("check", style="bold", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("what was seen / what to do", ratio=1, min_width=40)
    table.add_column("req", no_wrap=True, style="dim")
    for f in findings:
        sentence = escape(f.sentence)
        if f.examples:
            sentence += f" [dim](e.g. {escape(', '.join(map(str, f.examples[:3])))})[/]"
        table.add_row(
            f.check, f"[{VERDICT_STYLE[f.verdict]}]{f.verdict}[/]", sentence, f.requirement
        )
    return table


def print_findings(findings: list[Finding], title: str) -> None:
    console.print(findings_table(findings, title))


@dataclass
class JsonChannel:
    """Where a `--json` command's one document goes, and whether it was written."""

    stream: TextIO
    written: bool = False


_channels: list[JsonChannel] = []


def json_safe(value: Any) -> Any:
    """A value JSON can hold: JSON has no NaN or Infinity (such floats become their text, as
    Python's json would otherwise write the invalid `NaN`); keys become strings, paths text."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def print_json(payload: Any) -> None:
    """Machine-readable output on stdout, nothing else on it, and always valid JSON."""
    channel = _channels[-1] if _channels else None
    stream = channel.stream if channel else sys.stdout
    text = json.dumps(json_safe(payload), indent=2, ensure_ascii=False, default=str)
    stream.write(text + "\n")
    stream.flush()
    if channel:
        channel.written = True


@contextmanager
def json_stdout() -> Iterator[JsonChannel]:
    """While a `--json` command runs, stdout carries only what `print_json` writes.

    Everything else that would reach stdout (progress lines, notes such as "marked ...
    interrupted", library prints, child processes that inherit the descriptor) goes to stderr:
    the descriptor itself is pointed at stderr, so no writer is missed.
    """
    sys.stdout.flush()
    original = sys.stdout
    try:
        fd: int | None = original.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        fd = None  # an in-memory stdout (tests): no descriptor to move
    kept = None
    stream: TextIO = original
    if fd is not None:
        kept = os.dup(fd)
        os.dup2(sys.stderr.fileno(), fd)
        stream = os.fdopen(os.dup(kept), "w", encoding="utf-8")
    channel = JsonChannel(stream)
    _channels.append(channel)
    sys.stdout = sys.stderr
    try:
        yield channel
    finally:
        _channels.pop()
        sys.stdout = original
        if fd is not None and kept is not None:
            stream.close()
            os.dup2(kept, fd)
            os.close(kept)
