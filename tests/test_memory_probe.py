"""The one memory probe (S4, S5, S6): CPU peaks measured for real, the CUDA path through a
fake `torch.cuda` because this machine has no GPU."""

from __future__ import annotations

import pytest

from tunepilot.measure import counters
from tunepilot.measure.memory import MemoryProbe, is_out_of_memory

MB = 1024**2


def test_s5_cpu_probe_sees_a_200mb_phase_and_not_an_empty_one() -> None:
    torch = pytest.importorskip("torch")
    probe = MemoryProbe.for_device("cpu")
    with probe.phase("allocate") as big:
        x = torch.ones(50_000_000)  # 200 MB, written, so the pages are resident
    del x
    with probe.phase("nothing") as small:
        y = sum(range(1000))
    assert y > 0
    if big.flags:
        pytest.skip(f"cannot reset the peak here: {big.flags}")
    assert big.completed and big.device_kind == "cpu" and big.counters == ("rss",)
    assert big.peak_delta_bytes("rss") >= 150 * MB
    assert small.peak_delta_bytes("rss") < 20 * MB
    assert big.reading("rss").peak_bytes >= big.reading("rss").baseline_bytes + 150 * MB
    assert big.duration_s is not None and big.duration_s > 0
    assert [r.phase for r in probe.records] == ["allocate", "nothing"]


def test_s5_cpu_probe_tensors_column_comes_from_the_profiler() -> None:
    torch = pytest.importorskip("torch")
    probe = MemoryProbe.for_device("cpu", tensors=True)
    with probe.phase("two_buffers") as record:
        a = torch.ones(25_000_000)  # 10^8 bytes
        b = a * 2  # another 10^8, then freed: the tensor peak is 2 x 10^8, 10^8 kept
        del b
    del a
    assert record.counters == ("rss", "tensors")
    tensors = record.reading("tensors")
    assert 200_000_000 <= tensors.peak_delta_bytes <= 200_000_000 + 4096
    assert "net kept 1000" in tensors.note
    # A separate column, never folded into the RSS one.
    row = record.to_row()
    assert row["cpu/tensors/peak_delta_bytes"] == tensors.peak_delta_bytes
    assert row["cpu/rss/peak_delta_bytes"] == record.reading("rss").peak_delta_bytes


def test_s5_cpu_probe_says_when_the_peak_cannot_be_reset(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(counters, "CLEAR_REFS", tmp_path / "absent" / "clear_refs")
    probe = MemoryProbe.for_device("cpu")
    with probe.phase("load") as record:
        pass
    assert record.flags and "peak since process start" in record.flags[0]
    assert "peak since process start" in record.reading("rss").note
    assert "peak since process start" in record.to_row()["flags"]


def test_s6_out_of_memory_inside_a_phase_is_recorded_and_reraised() -> None:
    probe = MemoryProbe.for_device("cpu")
    with pytest.raises(RuntimeError, match="out of memory"), probe.phase("first_step"):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    record = probe.records[-1]
    assert record.phase == "first_step"
    assert not record.completed and record.out_of_memory
    assert "CUDA out of memory" in record.error
    assert record.reading("rss").peak_bytes is not None  # what was measured is kept


def test_s6_is_out_of_memory_recognises_the_errors_torch_raises() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as real_cpu_failure:
        torch.empty(10**14)  # a real allocation failure on CPU, raised at once
    assert is_out_of_memory(real_cpu_failure.value)
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("HIP out of memory. Tried to allocate 1 GiB"))
    assert is_out_of_memory(MemoryError())
    wrapped = ValueError("step failed")
    wrapped.__cause__ = RuntimeError("CUDA out of memory")
    assert is_out_of_memory(wrapped)
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))  # not a runtime/memory error


def test_s5_phases_do_not_nest() -> None:
    probe = MemoryProbe.for_device("cpu")
    nested = pytest.raises(RuntimeError, match="inside phase 'outer'")
    with probe.phase("outer"), nested, probe.phase("inner"):
        pass


class FakeCuda:
    """Stands in for `torch.cuda` because no GPU is here. It keeps the allocator's two
    counters the way PyTorch does: `allocated` (live tensors) and `reserved` (whole 2 MiB
    blocks held by the cache, kept after a free), their peaks, and a log of every call."""

    BLOCK = 2 * MB

    def __init__(self, n: int = 2) -> None:
        self.calls: list[tuple[str, int]] = []
        self.alloc = [0] * n
        self.res = [0] * n
        self.max_alloc = [0] * n
        self.max_res = [0] * n

    def device_count(self) -> int:
        return len(self.alloc)

    def synchronize(self, device: int) -> None:
        self.calls.append(("synchronize", device))

    def reset_peak_memory_stats(self, device: int) -> None:
        self.calls.append(("reset_peak_memory_stats", device))
        self.max_alloc[device], self.max_res[device] = self.alloc[device], self.res[device]

    def memory_allocated(self, device: int) -> int:
        self.calls.append(("memory_allocated", device))
        return self.alloc[device]

    def memory_reserved(self, device: int) -> int:
        self.calls.append(("memory_reserved", device))
        return self.res[device]

    def max_memory_allocated(self, device: int) -> int:
        self.calls.append(("max_memory_allocated", device))
        return self.max_alloc[device]

    def max_memory_reserved(self, device: int) -> int:
        self.calls.append(("max_memory_reserved", device))
        return self.max_res[device]

    # what a phase's kernels would do
    def malloc(self, device: int, nbytes: int) -> None:
        self.calls.append(("work", device))
        self.alloc[device] += nbytes
        if self.alloc[device] > self.res[device]:
            self.res[device] = -(-self.alloc[device] // self.BLOCK) * self.BLOCK
        self.max_alloc[device] = max(self.max_alloc[device], self.alloc[device])
        self.max_res[device] = max(self.max_res[device], self.res[device])

    def free(self, device: int, nbytes: int) -> None:
        self.calls.append(("work", device))
        self.alloc[device] -= nbytes  # the cache keeps the block: reserved stays


def test_cuda_probe_with_fake_device_keeps_allocated_and_reserved_separate() -> None:
    """A fake torch.cuda (no GPU here): two counters per device, two column groups, no sum."""
    cuda = FakeCuda(2)
    cuda.malloc(0, 10 * MB)  # weights, before the phase
    probe = MemoryProbe.for_device("cuda", cuda_api=cuda)
    with probe.phase("first_step") as record:
        cuda.malloc(0, 100 * MB)
        cuda.free(0, 100 * MB)
        cuda.malloc(1, 3 * MB)
    assert record.device_kind == "cuda" and record.devices == ("cuda:0", "cuda:1")
    a0, r0 = record.reading("allocated", "cuda:0"), record.reading("reserved", "cuda:0")
    assert (a0.baseline_bytes, a0.peak_bytes, a0.peak_delta_bytes) == (10 * MB, 110 * MB, 100 * MB)
    assert (r0.baseline_bytes, r0.peak_bytes, r0.peak_delta_bytes) == (10 * MB, 110 * MB, 100 * MB)
    a1, r1 = record.reading("allocated", "cuda:1"), record.reading("reserved", "cuda:1")
    assert (a1.peak_bytes, r1.peak_bytes) == (3 * MB, 4 * MB)  # reserved rounds to blocks
    # Never summed: neither across counters nor across devices.
    assert record.peak_bytes("reserved") == 110 * MB
    assert record.peak_bytes("allocated") == 110 * MB
    row = record.to_row()
    groups = {key.split("/")[1] for key in row if key.startswith("cuda:")}
    assert groups == {"allocated", "reserved"}
    assert row["cuda:1/allocated/peak_bytes"] == 3 * MB
    assert row["cuda:1/reserved/peak_bytes"] == 4 * MB
    assert 7 * MB not in row.values() and 220 * MB not in row.values()
    assert not any("total" in key or "sum" in key for key in row)


def test_cuda_probe_with_fake_device_resets_peaks_per_device_each_phase() -> None:
    """A fake torch.cuda (no GPU here): every phase resets every device's peak first."""
    cuda = FakeCuda(2)
    probe = MemoryProbe.for_device("cuda", cuda_api=cuda)
    with probe.phase("first_step"):
        cuda.malloc(0, 50 * MB)
        cuda.free(0, 50 * MB)
    cuda.calls.clear()
    with probe.phase("steady_step") as second:
        cuda.malloc(1, MB)
    resets = [d for name, d in cuda.calls if name == "reset_peak_memory_stats"]
    assert resets == [0, 1]
    # The first phase's 50 MB peak does not leak into the second phase's record.
    assert second.reading("allocated", "cuda:0").peak_bytes == 0
    assert second.reading("reserved", "cuda:0").peak_delta_bytes == 0
    assert second.reading("allocated", "cuda:1").peak_delta_bytes == MB


def test_cuda_probe_with_fake_device_synchronizes_before_reading() -> None:
    """A fake torch.cuda (no GPU here): synchronize precedes the reset and every peak read."""
    cuda = FakeCuda(2)
    probe = MemoryProbe.for_device("cuda", cuda_api=cuda)
    with probe.phase("evaluation"):
        cuda.malloc(0, MB)
        cuda.malloc(1, MB)
    calls = cuda.calls
    for device in (0, 1):
        first_reset = calls.index(("reset_peak_memory_stats", device))
        assert ("synchronize", device) in calls[:first_reset]
        last_work = max(i for i, c in enumerate(calls) if c == ("work", device))
        first_read = min(
            calls.index(("max_memory_allocated", device)),
            calls.index(("max_memory_reserved", device)),
        )
        assert ("synchronize", device) in calls[last_work:first_read]


def test_cuda_probe_with_fake_device_measures_only_the_named_device() -> None:
    """A fake torch.cuda (no GPU here): "cuda:1" touches device 1 only (one rank, one GPU)."""
    cuda = FakeCuda(2)
    probe = MemoryProbe.for_device("cuda:1", cuda_api=cuda)
    with probe.phase("load") as record:
        cuda.malloc(1, 5 * MB)
    assert record.devices == ("cuda:1",)
    assert {d for name, d in cuda.calls if name != "work"} == {1}
    assert record.reading("reserved").peak_delta_bytes == 6 * MB


def test_cuda_probe_with_fake_device_keeps_the_phase_error_when_reading_fails() -> None:
    """A fake torch.cuda (no GPU here) whose counters fail after an out-of-memory error: the
    phase's own error reaches the caller, the failed read is a flag on the record (S6)."""

    class BrokenAfterOom(FakeCuda):
        def max_memory_allocated(self, device: int) -> int:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    cuda = BrokenAfterOom(1)
    probe = MemoryProbe.for_device("cuda", cuda_api=cuda)
    with pytest.raises(RuntimeError, match="CUDA out of memory"), probe.phase("first_step"):
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")
    record = probe.records[-1]
    assert record.out_of_memory and not record.completed
    assert "memory not read after the error" in record.flags[0]
