"""The run's JSONL records (metrics.jsonl, evals.jsonl): written by rank 0, one line per
event, rewound to a checkpoint on resume. Metrics are read back as JSONL, never scraped.
The progress bar is the same record, for a person watching."""

from __future__ import annotations

import functools
import json
import math
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol


def finite_json(record: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN: a non-finite number becomes null plus its text (the line is kept)."""
    out = dict(record)
    for key, value in record.items():
        if isinstance(value, float) and not math.isfinite(value):
            out[key], out[f"{key}_text"] = None, str(value)
    return out


def write_line(path: Path, record: dict[str, Any], rank: int) -> None:
    if rank == 0:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, allow_nan=False) + "\n")


def rewind_jsonl(path: Path, update: int) -> None:
    """Keep the lines up to `update`, and drop a line that a kill cut in half."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["update"] <= update:
                kept.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")


class RecordSink(Protocol):
    """Somewhere the loop's records also go (a tracker such as TensorBoard or MLflow).

    The run's JSONL files and the ledger stay the source of truth; a sink is a copy for the
    tools a team already reads. `start` gets the update the run continues from (0, or the
    checkpoint's on resume); `update` one applied or refused update's record; `evaluation` one
    validation point; `close` the loop's end status.
    """

    name: str

    def start(self, update: int) -> None: ...
    def update(self, record: dict[str, Any]) -> None: ...
    def evaluation(self, update: int, metrics: dict[str, Any]) -> None: ...
    def close(self, status: str) -> None: ...


TRACKER_SECONDS = 60.0
"""The longest one tracker call may take before the tracker is switched off: a store that
cannot answer (a network share gone, a server that never replies) must not stall training. It
is generous because a healthy first call imports the library and creates its store (seconds on
a quiet machine, tens of seconds on a loaded one); a store known to be unusable fails at once
(tracking.py opens MLflow's SQLite file itself first)."""


def bounded(call: Callable[[], None], seconds: float) -> None:
    """Run `call` and wait at most `seconds` for it; what it raises is raised here, and a call
    still running then raises TimeoutError. The call runs in a daemon thread while this one
    waits, so the two never run together; one that never returns is left to the process's
    exit."""
    failed: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the waiting thread, never printed there
            failed.append(exc)

    worker = threading.Thread(target=target, name="tracker", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer in {seconds:g} s")
    if failed:
        raise failed[0]


class Records:
    """Where every record of a run goes: its JSONL files first, then each sink.

    Only rank 0 writes. A sink that raises, or takes more than `TRACKER_SECONDS` for one call,
    is switched off with one line on stderr naming it and the error; the run, its files and
    the ledger carry on untouched.
    """

    def __init__(self, run_dir: Path, rank: int, sinks: Sequence[RecordSink] = (),
                 tracker_seconds: float = TRACKER_SECONDS) -> None:  # fmt: skip
        self.metrics_path, self.evals_path = run_dir / "metrics.jsonl", run_dir / "evals.jsonl"
        self.rank = rank
        self.sinks = list(sinks) if rank == 0 else []
        self.tracker_seconds = tracker_seconds

    def rewind(self, update: int) -> None:
        """On resume: lines written after the checkpoint belong to a future that was lost."""
        if self.rank == 0:
            rewind_jsonl(self.metrics_path, update)
            rewind_jsonl(self.evals_path, update)

    def start(self, update: int) -> None:
        self._each("start", update)

    def update(self, record: dict[str, Any]) -> None:
        write_line(self.metrics_path, finite_json(record), self.rank)
        self._each("update", record)

    def evaluation(self, update: int, metrics: dict[str, Any]) -> None:
        write_line(self.evals_path, {"update": update, "eval": metrics}, self.rank)
        self._each("evaluation", update, metrics)

    def close(self, status: str) -> None:
        self._each("close", status)

    def _each(self, method: str, *args: Any) -> None:
        for sink in list(self.sinks):
            try:
                bounded(functools.partial(getattr(sink, method), *args), self.tracker_seconds)
            except Exception as exc:  # a tracker never fails a run: say so once, carry on
                self.sinks.remove(sink)
                from tunepilot.console import error_console

                error_console.print(
                    f"[yellow]warning:[/] tracker {sink.name} stopped ({type(exc).__name__}: "
                    f"{exc}); the run goes on, its metrics are in metrics.jsonl and the ledger",
                    highlight=False, soft_wrap=True,
                )  # fmt: skip
