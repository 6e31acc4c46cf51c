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
from pathlib import Path
from typing import Any, Protocol

from tunepilot.errors import input_error

CLEAR_REFS = Path("/proc/self/clear_refs")
PROC_STATUS = Path("/proc/self/status")

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
class CounterReading:
    """One counter on one device over one phase. Bytes; None where the counter is unknown."""

    device: str  # "cuda:0", "cpu"
    counter: str  # "allocated", "reserved", "rss", "tensors"
    baseline_bytes: int | None  # the counter at phase start, after a device synchronise
    peak_bytes: int | None  # the absolute peak during the phase
    peak_delta_bytes: int | None  # peak minus baseline: what the phase itself added
    note: str = ""  # a caveat on how this number was obtained


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


class Counters(Protocol):
    """What a device must provide to the probe: sync, reset/read at start, read at finish."""

    kind: str
    counters: tuple[str, ...]
    devices: tuple[str, ...]

    def synchronize(self) -> None: ...

    def start(self, phase: str) -> None: ...

    def finish(self) -> tuple[list[CounterReading], list[str]]: ...


class CudaCounters:
    """`torch.cuda`'s allocator counters, per device; `cuda_api` is injectable for tests.

    ROCm builds of PyTorch expose the same `torch.cuda` API (HIP underneath); only the kind
    recorded differs. `indices` are the device ordinals this process measures.
    """

    counters = ("allocated", "reserved")

    def __init__(self, cuda_api: Any, indices: list[int], kind: str = "cuda") -> None:
        self.cuda = cuda_api
        self.indices = list(indices)
        self.kind = kind
        self.devices = tuple(f"cuda:{i}" for i in self.indices)
        self._baseline: dict[int, tuple[int, int]] = {}

    def synchronize(self) -> None:
        for i in self.indices:
            self.cuda.synchronize(i)

    def start(self, phase: str) -> None:
        # Synchronise first: kernels still queued from the previous phase would otherwise
        # allocate after the reset and be counted here.
        self.synchronize()
        self._baseline = {}
        for i in self.indices:
            self.cuda.reset_peak_memory_stats(i)
            self._baseline[i] = (
                int(self.cuda.memory_allocated(i)),
                int(self.cuda.memory_reserved(i)),
            )

    def finish(self) -> tuple[list[CounterReading], list[str]]:
        self.synchronize()
        readings: list[CounterReading] = []
        for i in self.indices:
            base_alloc, base_res = self._baseline[i]
            peak_alloc = int(self.cuda.max_memory_allocated(i))
            peak_res = int(self.cuda.max_memory_reserved(i))
            device = f"cuda:{i}"
            readings.append(
                CounterReading(device, "allocated", base_alloc, peak_alloc, peak_alloc - base_alloc)
            )
            readings.append(
                CounterReading(device, "reserved", base_res, peak_res, peak_res - base_res)
            )
        return readings, []


def _proc_status_bytes() -> dict[str, int]:
    """VmHWM and VmRSS from /proc/self/status, in bytes (the file says kB = 1024 bytes)."""
    out: dict[str, int] = {}
    for line in PROC_STATUS.read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(rest.split()[0]) * 1024
    return out


class CpuCounters:
    """Peak RSS of the phase (VmHWM after a clear_refs reset) and, optionally, tensor bytes."""

    kind = "cpu"
    devices = ("cpu",)

    def __init__(self, tensors: bool = False) -> None:
        self.tensors = tensors
        self.counters = ("rss", "tensors") if tensors else ("rss",)
        self._baseline: int | None = None
        self._reset_note = ""
        self._profiler: Any = None
        self._label: Any = None

    def synchronize(self) -> None:
        """CPU ops are synchronous: nothing to wait for."""

    def _reset_peak(self) -> str:
        """Reset VmHWM; return a caveat when that is impossible (peak then covers the process)."""
        try:
            CLEAR_REFS.write_text("5")
        except OSError as exc:
            return (
                f"peak since process start: cannot reset it through {CLEAR_REFS} "
                f"({exc.strerror or exc}); the phase's own peak is at most this"
            )
        return ""

    def start(self, phase: str) -> None:
        if not PROC_STATUS.is_file():
            self._reset_note = f"{PROC_STATUS} is absent: no RSS peak on this system"
            self._baseline = None
        else:
            self._reset_note = self._reset_peak()
            self._baseline = _proc_status_bytes()["VmRSS"]
        if self.tensors:
            from torch.profiler import ProfilerActivity, profile, record_function

            self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profiler.__enter__()
            self._label = record_function(f"tunepilot:{phase}")
            self._label.__enter__()

    def finish(self) -> tuple[list[CounterReading], list[str]]:
        flags: list[str] = []
        if self._baseline is None:
            rss = CounterReading("cpu", "rss", None, None, None, self._reset_note)
        else:
            status = _proc_status_bytes()
            # The kernel updates VmHWM lazily (batched RSS counters), so a VmRSS read just
            # after the reset can exceed it by a few pages; the phase's peak is never below
            # where it started.
            peak = max(status["VmHWM"], self._baseline)
            rss = CounterReading("cpu", "rss", self._baseline, peak, peak - self._baseline)
            rss.note = self._reset_note
        if self._reset_note:
            flags.append(self._reset_note)
        readings = [rss]
        if self.tensors:
            readings.append(self._finish_profiler(flags))
        return readings, flags

    def _finish_profiler(self, flags: list[str]) -> CounterReading:
        """Tensor bytes from the profiler's allocation events: peak above the start, net kept."""
        self._label.__exit__(None, None, None)
        self._profiler.__exit__(None, None, None)
        prof, self._profiler, self._label = self._profiler, None, None
        # Allocation events carry signed sizes in time order; their running sum is the tensor
        # bytes above the phase's start. `kineto_results` is internal to torch.profiler: if a
        # torch version drops it, the column says so instead of failing the phase.
        kineto = getattr(prof.profiler, "kineto_results", None)
        if kineto is None:
            flags.append("tensor bytes unavailable: this torch profiler has no kineto_results")
            return CounterReading("cpu", "tensors", None, None, None, "unavailable")
        sizes = sorted(
            (e.start_ns(), int(e.nbytes()))
            for e in kineto.events()
            if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
        )
        running, peak = 0, 0
        for _, nbytes in sizes:
            running += nbytes
            peak = max(peak, running)
        note = (
            f"relative to the phase start (the profiler sees only the phase); net kept "
            f"{running} bytes; the profiler adds ~50% time to the phase"
        )
        return CounterReading("cpu", "tensors", 0, peak, peak, note)

    def abort(self) -> None:
        """Close the profiler if the phase raised before `finish` could."""
        if self._label is not None:
            self._label.__exit__(None, None, None)
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
        self._label = self._profiler = None


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
