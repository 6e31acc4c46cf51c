"""The device counters behind the one memory probe (S5): CUDA/ROCm allocator counters per
device (allocated and reserved kept apart, never summed) and the CPU's peak RSS per phase
(VmHWM after a /proc/self/clear_refs reset). `memory.MemoryProbe` is the API; these are the
backends it drives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

CLEAR_REFS = Path("/proc/self/clear_refs")
PROC_STATUS = Path("/proc/self/status")


@dataclass
class CounterReading:
    """One counter on one device over one phase. Bytes; None where the counter is unknown."""

    device: str  # "cuda:0", "cpu"
    counter: str  # "allocated", "reserved", "rss", "tensors"
    baseline_bytes: int | None  # the counter at phase start, after a device synchronise
    peak_bytes: int | None  # the absolute peak during the phase
    peak_delta_bytes: int | None  # peak minus baseline: what the phase itself added
    note: str = ""  # a caveat on how this number was obtained


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


def proc_status_bytes() -> dict[str, int]:
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
            self._baseline = proc_status_bytes()["VmRSS"]
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
            status = proc_status_bytes()
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
