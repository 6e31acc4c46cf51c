"""One memory probe for every phase of every run (S4, S5, STYLE practice 3).

    probe = MemoryProbe.for_device("cuda")        # or "cuda:1", "cpu", a torch.device, None
    with probe.phase("first_step") as record:
        loss.backward(); optimizer.step()
    record.to_row()   # flat: baseline, absolute peak and peak minus baseline, per device

Why one probe: memory numbers are only comparable when every phase is measured with the same
bounds (S5). Each phase synchronises the device, resets the peak counters, reads its
baseline, runs, synchronises again and reads the peaks. So the first step (which allocates
optimizer state) and the evaluation at the longest sequences each get their own peak instead
of inheriting the largest one seen so far.

What is counted where:
- CUDA / ROCm: `memory_allocated` (bytes held by live tensors) and `memory_reserved` (bytes
  the caching allocator holds from the driver). They are two separate column groups and are
  never summed: reserved already contains allocated, and the gap between them is the cache
  and its fragmentation (S5). Counters are per process and per device; every device of the
  probe is recorded with the same bounds.
- CPU: the peak resident set size of the phase. Writing "5" to /proc/self/clear_refs resets
  VmHWM to the current RSS, so VmHWM read afterwards is the phase's own peak. RSS deltas
  before/after are useless because the heap reuses freed memory (see ENV.md). When
  clear_refs is not writable the peak is the process's since it started: the record says so
  rather than pretending. With `tensors=True`, the PyTorch profiler adds the tensor bytes
  allocated inside the phase (peak above the start and net kept) as a separate column.

The CPU path without `tensors` imports nothing heavy; torch is imported only when a CUDA
probe or the profiler needs it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from tunepilot.errors import input_error
from tunepilot.measure.counters import (
    CounterReading,
    Counters,
    CpuCounters,
    CudaCounters,
)

# Lower-cased fragments of the RuntimeError texts torch raises when memory runs out:
# "CUDA out of memory. Tried to allocate ...", "HIP out of memory ..." (ROCm), and on CPU
# "[enforce fail at alloc_cpu.cpp] ... DefaultCPUAllocator: can't allocate memory ...".
_OOM_MESSAGES = ("out of memory", "can't allocate memory")


def human_bytes(n: int | float | None) -> str:
    """`1288490188` -> `1.20 GiB`; None -> `n/a` (a counter this device does not have)."""
    if n is None:
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass
class PhaseMemory:
    """The flat record of one phase (S5). Filled when the `with` block exits, even on error."""

    phase: str
    device_kind: str  # "cuda", "rocm" or "cpu"
    counters: tuple[str, ...]
    devices: tuple[str, ...]
    readings: list[CounterReading] = field(default_factory=list)
    duration_s: float | None = None  # device-synchronised wall time of the phase
    completed: bool = False
    error: str | None = None  # the exception that ended the phase, if any
    out_of_memory: bool = False
    flags: list[str] = field(default_factory=list)  # caveats on the whole record

    def reading(self, counter: str, device: str | None = None) -> CounterReading:
        """The reading of `counter` on `device` (the only/first device when None)."""
        for r in self.readings:
            if r.counter == counter and (device is None or r.device == device):
                return r
        raise KeyError(f"no {counter!r} reading for {device or 'any device'} in {self.phase!r}")

    def peak_bytes(self, counter: str) -> int | None:
        """The highest absolute peak of `counter` over the devices (never summed across them)."""
        peaks = [r.peak_bytes for r in self.readings if r.counter == counter]
        known = [p for p in peaks if p is not None]
        return max(known) if known else None

    def peak_delta_bytes(self, counter: str) -> int | None:
        """The largest peak-minus-baseline of `counter` over the devices."""
        deltas = [r.peak_delta_bytes for r in self.readings if r.counter == counter]
        known = [d for d in deltas if d is not None]
        return max(known) if known else None

    def to_row(self) -> dict[str, Any]:
        """One flat dict: `<device>/<counter>/<baseline|peak|peak_delta>_bytes` columns."""
        row: dict[str, Any] = {
            "phase": self.phase,
            "device_kind": self.device_kind,
            "duration_s": self.duration_s,
            "completed": self.completed,
            "out_of_memory": self.out_of_memory,
            "error": self.error,
        }
        for r in self.readings:
            prefix = f"{r.device}/{r.counter}"
            row[f"{prefix}/baseline_bytes"] = r.baseline_bytes
            row[f"{prefix}/peak_bytes"] = r.peak_bytes
            row[f"{prefix}/peak_delta_bytes"] = r.peak_delta_bytes
            if r.note:
                row[f"{prefix}/note"] = r.note
        row["flags"] = "; ".join(self.flags)
        return row

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["counters"] = list(self.counters)
        out["devices"] = list(self.devices)
        return out

    def summary(self) -> str:
        """A short text for a table cell: the peak and the delta of each counter."""
        parts = []
        for counter in self.counters:
            peak = self.peak_bytes(counter)
            if peak is None:
                continue
            delta = self.peak_delta_bytes(counter)
            parts.append(f"{counter} peak {human_bytes(peak)} (+{human_bytes(delta)})")
        return ", ".join(parts) or "no memory counter"


def _parse_device(device: Any) -> tuple[str, int | None]:
    """`"cuda:1"`, `torch.device("cuda", 1)`, `"cpu"` -> ("cuda", 1) / ("cpu", None)."""
    if device is None:
        import torch

        return ("cuda", None) if torch.cuda.is_available() else ("cpu", None)
    kind = getattr(device, "type", None)
    if kind is not None:
        return str(kind), getattr(device, "index", None)
    text = str(device).strip().lower()
    kind, _, index = text.partition(":")
    if index and not index.isdigit():
        raise input_error("device", f"`{device}`", "write the device as cpu, cuda or cuda:N")
    return kind, int(index) if index else None


class MemoryProbe:
    """Measures one phase at a time; phases do not nest (a nested reset would corrupt the
    outer phase's peak)."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self.records: list[PhaseMemory] = []
        self._active: str | None = None

    @classmethod
    def for_device(
        cls, device: Any = None, *, tensors: bool = False, cuda_api: Any = None
    ) -> MemoryProbe:
        """The probe for `device`: "cpu", "cuda" (every visible GPU), "cuda:N" (that one).

        Under torchrun give each rank its own "cuda:N": resetting counters on a device
        creates a CUDA context there, which would cost every rank memory on every GPU.
        `cuda_api` replaces `torch.cuda` (tests without a GPU inject a fake).
        `tensors=True` adds the profiler's tensor bytes on CPU (~50% slower phases).
        """
        kind, index = _parse_device(device)
        if kind == "cpu":
            return cls(CpuCounters(tensors=tensors))
        if kind != "cuda":
            raise input_error(
                "device", f"`{device}` (no memory probe for `{kind}`)", "use cpu, cuda or cuda:N"
            )
        backend = "cuda"
        if cuda_api is None:
            import torch

            if not torch.cuda.is_available():
                raise input_error(
                    "device", f"`{device}` but torch sees no GPU", "use cpu, or check the driver"
                )
            cuda_api = torch.cuda
            backend = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        indices = [index] if index is not None else list(range(int(cuda_api.device_count())))
        return cls(CudaCounters(cuda_api, indices, kind=backend))

    @contextmanager
    def phase(self, name: str) -> Iterator[PhaseMemory]:
        """Measure the block as phase `name`; the yielded record is filled when it exits.

        An exception inside the block is recorded (and flagged when it is an out-of-memory
        error, S6) and then re-raised: the caller decides what happens next.
        """
        if self._active is not None:
            raise RuntimeError(f"phase {name!r} started inside phase {self._active!r}")
        c = self.counters
        record = PhaseMemory(name, c.kind, tuple(c.counters), tuple(c.devices))
        self._active = name
        try:
            c.start(name)
            start = time.perf_counter()
            try:
                yield record
            except BaseException as exc:
                record.error = f"{type(exc).__name__}: {exc}"[:500]
                record.out_of_memory = is_out_of_memory(exc)
                try:
                    self._close(record, start)
                except Exception as secondary:
                    # The phase's own error matters more: a failed read must not mask it.
                    record.flags.append(f"memory not read after the error: {secondary}")
                    self.records.append(record)
                raise
            record.completed = True
            self._close(record, start)
        finally:
            abort = getattr(c, "abort", None)
            if abort is not None:
                abort()
            self._active = None

    def _close(self, record: PhaseMemory, start: float) -> None:
        """Synchronise, then read the clock and the peaks, then keep the record."""
        self.counters.synchronize()  # the phase's queued work counts in its time and peak
        record.duration_s = time.perf_counter() - start
        record.readings, flags = self.counters.finish()
        record.flags.extend(flags)
        self.records.append(record)


def is_out_of_memory(exc: BaseException) -> bool:
    """True when `exc` (or what caused it) is a device or host out-of-memory error (S6).

    torch is not imported for this: if it was never imported, no torch error can exist.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError):
            return True
        torch = sys.modules.get("torch")
        oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
        if oom_type is not None and isinstance(current, oom_type):
            return True
        text = str(current).lower()
        if isinstance(current, RuntimeError) and any(m in text for m in _OOM_MESSAGES):
            return True
        current = current.__cause__ or current.__context__
    return False
