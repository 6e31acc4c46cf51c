"""Every rank's memory per phase of a run, with the same bounds as the pilot's gates (S4, S5).

A run is measured where it can differ from what the pilot saw: loading (and wrapping, under
DDP or FSDP), the first update (which allocates the optimizer state), a steady update, the
first evaluation and the first checkpoint. Each phase goes through the one memory probe
(memory.py: synchronise, reset the peaks, read the baseline, run, synchronise, read the
peaks), on the device this rank trains on, and becomes one JSON line of
`runs/<id>/memory/rank-<k>.jsonl`: the same record a pilot gate keeps, plus the rank, the
world size and the update it was taken at. One file per rank: a rank never waits for
another to write, and a rank that dies keeps what it measured.

Under DDP rank 0 alone evaluates (the others go on to the next collective), so only its file
has an evaluation row; under FSDP every rank joins the evaluation and writes one. Only the
first occurrence of each phase in a call is measured (a resumed run measures its own
first update again, from the update it resumed at): resetting the peak counters costs little,
but a row per update would say nothing the first ones do not.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tunepilot.measure.memory import MemoryProbe

T = TypeVar("T")
UPDATE_PHASES = ("first update", "steady update")


class PhaseLog:
    """Measures named phases of one rank and appends each to its JSON lines file."""

    def __init__(self, probe: MemoryProbe | None, path: Path | None, rank: int = 0,
                 world_size: int = 1) -> None:  # fmt: skip
        self.probe, self.path, self.rank, self.world_size = probe, path, rank, world_size
        self.seen: set[str] = set()
        self.update: int | None = None  # the update the loop is at, for the rows
        self._updates = 0
        self._open: contextlib.ExitStack | None = None
        self._outer: BaseException | None = None  # an exception already handled at begin

    @classmethod
    def for_run(cls, run_dir: Path, device: Any, rank: int = 0, world_size: int = 1) -> PhaseLog:
        """The log of `rank` under `run_dir/memory/`, probing `device` ("cpu", "cuda:N")."""
        return cls(MemoryProbe.for_device(device), Path(run_dir) / "memory" /
                   f"rank-{rank}.jsonl", rank, world_size)  # fmt: skip

    @classmethod
    def off(cls) -> PhaseLog:
        """Measures nothing: a loop run inside a pilot gate, whose own probe is measuring."""
        return cls(None, None)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure the block as `name` (once per call of the log's owner), then write it."""
        if self.probe is None or name in self.seen:
            yield
            return
        self.seen.add(name)
        record = None
        try:
            with self.probe.phase(name) as record:
                yield
        finally:
            if record is not None and self.probe.records and self.probe.records[-1] is record:
                self._write(record)

    def wrap(self, name: str, fn: Callable[..., T]) -> Callable[..., T]:
        """`fn` measured as phase `name` the first time it is called."""

        def measured(*args: Any, **kwargs: Any) -> T:
            self.end()  # phases never nest: an update in progress ends here
            with self.phase(name):
                return fn(*args, **kwargs)

        return measured

    def begin_update(self, done: int) -> None:
        """The loop starts update `done + 1`: the first and second of this call are phases."""
        self.update = done + 1
        self._updates += 1
        if self._updates <= len(UPDATE_PHASES):
            self._outer = sys.exc_info()[1]
            self._open = contextlib.ExitStack()
            self._open.enter_context(self.phase(UPDATE_PHASES[self._updates - 1]))

    def end(self) -> None:
        """End the update phase in progress, if any."""
        stack, self._open = self._open, None
        if stack is not None:
            stack.close()

    def close(self) -> None:
        """End whatever is open, recording the exception in flight if there is one (called
        from a `finally`, where the exception a caller was already handling is not ours)."""
        stack, self._open = self._open, None
        if stack is not None:
            exc = sys.exc_info()[1]
            exc = None if exc is self._outer else exc
            stack.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)

    def _write(self, record: Any) -> None:
        if self.path is None:
            return
        row = {"rank": self.rank, "world_size": self.world_size, "update": self.update,
               **record.to_json()}  # fmt: skip
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row, default=str) + "\n")


def read_phase_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Every rank's rows of a run, rank by rank (a torn last line, from a killed rank, is
    skipped)."""
    rows = []
    for path in sorted((Path(run_dir) / "memory").glob("rank-*.jsonl"),
                       key=lambda p: int(p.stem.split("-")[1])):  # fmt: skip
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    return rows
