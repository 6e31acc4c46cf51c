"""Progress of long commands (run, pilot, baseline, evaluation, audit, demo), always on stderr.

On a terminal: a Rich bar with elapsed time, rate and ETA. Sent to a file or a pipe (`nohup`,
`tee`, CI logs), or with `CI` set: one plain line when the work starts, one per minute while
it runs and one when it ends, so a log shows where a 16-minute pilot is without filling up
with redraws. stdout is never touched: `--json` output stays one document.

Progress opened inside another (a validation pass inside training) is a second row of the same
bar on a terminal, and in a log it prints only its per-minute lines, so a 5-minute evaluation
between two updates is never silent and a quick one adds nothing. Work that has no steps to
count for minutes (a pilot gate, the audit's checks) takes `heartbeat=True`: in a log a line
per minute says it is still running.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Literal

from rich.progress import ProgressColumn
from rich.text import Text

Mode = Literal["bar", "lines", "off"]

LINE_EVERY_S = 60.0
_open: list[Progress] = []  # the progress shown now, outermost first


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
        show: bool | None = None, every_s: float = LINE_EVERY_S, heartbeat: bool = False,
    ) -> None:  # fmt: skip
        self.what, self.total, self.unit, self.every_s = what, total, unit, every_s
        self.first = self.completed = done
        self.note = ""
        self.mode: Mode = "off" if show is False else ("lines" if plain_output() else "bar")
        self.heartbeat = heartbeat
        self._bar: Any = None
        self._task: Any = None
        self._owns_bar = self._inner = False
        self._lines = 0
        self._stopped = threading.Event()
        self._start = self._last_line = time.monotonic()

    def start(self) -> Progress:
        self._start = self._last_line = time.monotonic()
        outer = _open[-1] if _open else None
        self._inner = outer is not None
        if self.mode == "bar" and outer is not None and outer._bar is not None:
            self._bar = outer._bar  # a second row of the bar already on screen
            self._task = self._bar.add_task(self.what, total=self.total, completed=self.completed,
                                            note="", unit=self.unit)  # fmt: skip
        elif self.mode == "bar":
            self._bar, self._task = _rich_bar(self.what, self.total, self.unit, self.completed)
            self._owns_bar = True
            self._bar.start()
        elif self.mode == "lines" and not self._inner:
            self._line("started")
        if self.mode != "off":
            _open.append(self)
            if self.mode == "lines" and self.heartbeat:
                threading.Thread(target=self._beat, daemon=True).start()
        return self

    def stop(self, state: str = "done") -> None:
        self._stopped.set()
        if self in _open:
            _open.remove(self)
        if self._bar is not None:
            if self._owns_bar:
                self._bar.stop()
            else:
                self._bar.remove_task(self._task)
            self._bar = None
        elif self.mode == "lines" and (not self._inner or self._lines):
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
        elif self.mode == "lines" and time.monotonic() - self._last_line >= self.every_s and (
                self.total is None or self.completed < self.total):  # the end has its own line
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
        if self.total is None and self.completed == self.first:  # nothing counted: time only
            parts = parts[2:]
        if self.total is not None and rate > 0 and self.completed < self.total:
            parts.append(f"ETA {clock((self.total - self.completed) / rate)}")
        if self.note:
            parts.append(self.note)
        return ", ".join(parts)

    def _line(self, state: str = "") -> None:
        self._last_line = time.monotonic()
        self._lines += 1
        start_line(f"{self.what}: {state + ', ' if state else ''}{self.describe()}")

    def _beat(self) -> None:
        """In a log: a line when `every_s` passed without one, while this is the innermost
        progress shown (an inner one speaks for itself)."""
        while not self._stopped.wait(self.every_s / 4):
            quiet = time.monotonic() - self._last_line >= self.every_s
            if quiet and _open and _open[-1] is self:
                self._line("running")


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
        TextColumn("{task.fields[unit]}"),
        _Rate(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"), console=Console(stderr=True), expand=True,
    )  # fmt: skip
    task = bar.add_task(what, total=total, completed=done, note="", unit=unit)
    return bar, task
