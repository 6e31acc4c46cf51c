"""Progress of long commands (run, pilot, baseline, evaluation, audit, demo), always on stderr.

On a terminal: a Rich bar with elapsed time, rate and ETA. Sent to a file or a pipe (`nohup`,
`tee`, CI logs), or with `CI` set: one plain line when the work starts, one per minute while
it runs and one when it ends, so a log shows where a 16-minute pilot is without filling up
with redraws. stdout is never touched: `--json` output stays one document.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Literal

from rich.progress import ProgressColumn
from rich.text import Text

Mode = Literal["bar", "lines", "off"]

LINE_EVERY_S = 60.0


def plain_output() -> bool:
    """True when stderr is a file or pipe, or under CI: lines instead of a redrawn bar."""
    return not sys.stderr.isatty() or bool(os.environ.get("CI"))


def clock(seconds: float) -> str:
    """0:07, 12:30, 1:02:03: elapsed and remaining time the way people read them."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def start_line(text: str) -> None:
    """One line saying what starts now, so a long silent phase is never a mystery."""
    from tunepilot.console import error_console

    error_console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {text}", highlight=False,
                        soft_wrap=True)  # fmt: skip


class Progress:
    """`with Progress("training control-s0-1", total=200, unit="updates") as p: p.advance(...)`.

    `show` None picks the bar on a terminal and lines elsewhere; False shows nothing. `done`
    is where the work starts (a resumed run): the rate and ETA count this call's work only.
    """

    def __init__(
        self, what: str, total: int | None, unit: str, *, done: int = 0,
        show: bool | None = None, every_s: float = LINE_EVERY_S,
    ) -> None:  # fmt: skip
        self.what, self.total, self.unit, self.every_s = what, total, unit, every_s
        self.first = self.completed = done
        self.note = ""
        self.mode: Mode = "off" if show is False else ("lines" if plain_output() else "bar")
        self._bar: Any = None
        self._task: Any = None
        self._start = self._last_line = time.monotonic()

    def start(self) -> Progress:
        self._start = self._last_line = time.monotonic()
        if self.mode == "bar":
            self._bar, self._task = _rich_bar(self.what, self.total, self.unit, self.completed)
            self._bar.start()
        elif self.mode == "lines":
            self._line("started")
        return self

    def stop(self, state: str = "done") -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif self.mode == "lines":
            self._line(state)
        self.mode = "off"

    def __enter__(self) -> Progress:
        return self.start()

    def advance(self, completed: int | None = None, note: str = "") -> None:
        """Move to `completed` (or one step on); `note` is a short status such as the loss."""
        self.completed = self.completed + 1 if completed is None else completed
        self.note = note or self.note
        if self._bar is not None:
            self._bar.update(self._task, completed=self.completed, note=self.note)
        elif self.mode == "lines" and time.monotonic() - self._last_line >= self.every_s:
            self._line()

    def __exit__(self, *exc: object) -> None:
        self.stop("stopped" if exc[0] is not None else "done")

    def describe(self) -> str:
        """`120/400 updates, 2.10 updates/s, elapsed 1:02, ETA 2:13, loss 0.5213`."""
        elapsed = time.monotonic() - self._start
        rate = (self.completed - self.first) / elapsed if elapsed > 0 else 0.0
        of = f"/{self.total}" if self.total is not None else ""
        parts = [f"{self.completed}{of} {self.unit}", f"{rate:.2f} {self.unit}/s",
                 f"elapsed {clock(elapsed)}"]  # fmt: skip
        if self.total is not None and rate > 0 and self.completed < self.total:
            parts.append(f"ETA {clock((self.total - self.completed) / rate)}")
        if self.note:
            parts.append(self.note)
        return ", ".join(parts)

    def _line(self, state: str = "") -> None:
        self._last_line = time.monotonic()
        start_line(f"{self.what}: {state + ', ' if state else ''}{self.describe()}")


class _Rate(ProgressColumn):
    """Units per second over Rich's sliding window; blank until it has two points."""

    def render(self, task: Any) -> Text:
        speed = task.speed
        return Text("" if speed is None else f"{speed:.3g}/s", style="cyan")


def _rich_bar(what: str, total: int | None, unit: str, done: int) -> tuple[Any, Any]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as RichProgress

    bar = RichProgress(
        TextColumn("{task.description}"), BarColumn(bar_width=None), MofNCompleteColumn(),
        TextColumn(unit),
        _Rate(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"), console=Console(stderr=True), expand=True,
    )  # fmt: skip
    task = bar.add_task(what, total=total, completed=done, note="")
    return bar, task
