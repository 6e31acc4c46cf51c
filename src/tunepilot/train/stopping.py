"""When the loop saves a checkpoint and when it stops early on a signal (R1).

A preempted spot instance gets SIGTERM and, some seconds later, SIGKILL. A run that saves only
at its end then has nothing to resume, so:

* `CheckpointSchedule`: without `training.checkpoint_every`, a checkpoint is taken after the
  first update (so the save is measured) and then whenever the training time since the last
  save reaches the save's own duration divided by `SAVE_SHARE`: saving costs at most ~2% of
  the wall time, whatever the model size. A checkpoint is always taken at the end too.
* `StopSignals`: SIGTERM and SIGINT set a flag; the loop finishes the update in flight, saves a
  checkpoint at that update boundary and ends with status `stopped`, so the resumed run is
  bit-identical. A second Ctrl-C stops at once (KeyboardInterrupt).

Neither draws a random number: checkpoint timing never changes the trajectory.
"""

from __future__ import annotations

import math
import signal
import threading
from types import FrameType, TracebackType
from typing import Any

SAVE_SHARE = 0.02
"""The share of wall time automatic checkpoints may cost."""


class CheckpointSchedule:
    """Every `every` updates, or automatic (None) from the measured save time."""

    def __init__(self, every: int | None) -> None:
        self.every = every
        self.save_seconds: float | None = None
        self.trained_since_save = 0.0

    def due(self, done: int, update_seconds: float) -> bool:
        """After an update that took `update_seconds`: save now?"""
        self.trained_since_save += update_seconds
        if self.every is not None:
            return done % self.every == 0
        if self.save_seconds is None:
            return True  # the first save measures what a save costs
        return self.trained_since_save * SAVE_SHARE >= self.save_seconds

    def saved(self, seconds: float) -> None:
        self.save_seconds = seconds if self.save_seconds is None else max(seconds, 0.0)
        self.trained_since_save = 0.0

    def describe(self) -> str:
        if self.every is not None:
            return f"every {self.every} updates"
        if self.save_seconds is None:
            return "automatic (not measured yet)"
        gap = self.save_seconds / SAVE_SHARE
        return (f"automatic: a save takes {self.save_seconds:.2f} s, so one every "
                f"{math.ceil(gap)} s of training ({SAVE_SHARE:.0%})")  # fmt: skip


class StopSignals:
    """`with StopSignals() as stop:` ... `stop.received` is the first SIGTERM/SIGINT, or None.

    Handlers are installed only in the main thread (Python allows no other) and the previous
    ones come back on exit. Nested use is fine: the inner block shares the outer flag.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # asked twice: stop now, without the checkpoint
        self.received = self.received or signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                previous = signal.getsignal(sig)
                if isinstance(getattr(previous, "__self__", None), StopSignals):
                    return previous.__self__  # an outer block already listens
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
