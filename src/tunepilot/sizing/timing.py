"""Seconds per unit of campaign work on one card (L3, B1, L2): measured there, or computed.

Two sources, never mixed within a card, and one sentence that says which:

- **measured**: a pilot ran on this very card and its steady-step time was taken on a quiet
  machine. Its update, evaluation, checkpoint, resume and export times are used as they are.
- **computed**: FLOPs counted on the dry run of the campaign's exact step, divided by the
  card's public dense peak for the training precision times an assumed model FLOPs
  utilisation (`assumed_mfu` in the catalog); checkpoint save, resume and export are I/O and
  come from their bytes over an assumed disk speed. Both assumptions are named in the sentence.

A time measured on a CPU is never used for a GPU: the two do not scale into each other by any
factor worth trusting. A measurement taken while the machine was loaded (wall time far above
the process's CPU time, or a load average above the core count) is flagged noisy and not used.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from tunepilot.measure.memory import human_bytes
from tunepilot.sizing.catalog import Catalog, GpuCard

NOISY_CPU_SHARE = 0.5
"""On a CPU step, the process's CPU time over (wall time x its threads) below this means it
spent more than half its wall time waiting for a core: other work was running."""


@dataclass(frozen=True)
class WorkFlops:
    """What the campaign computes, counted on the dry run of its exact step."""

    per_update: float  # forward + backward of every microbatch of one update, optimizer step
    per_eval_pass: float  # one full validation pass (every batch at the longest length)
    precision: str  # the precision the matmuls run in: training.precision


class WorkBytes(NamedTuple):
    """What the I/O phases move: a checkpoint, the base weights a new process loads, the export."""

    checkpoint: int
    base_weights: int
    export: int


@dataclass(frozen=True)
class PhaseSeconds:
    """Seconds per unit of work on one card, and the one sentence that says where they come
    from. None of the fields is a guess without a label: `assumptions` lists each one used."""

    card: str
    update: float
    eval_pass: float
    checkpoint: float
    resume: float
    export: float
    measured: bool
    basis: str
    assumptions: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def noise_of(measurements: dict[str, Any]) -> str | None:
    """Why the pilot's step time was taken on a loaded machine, or None when it was quiet.

    Reads what the steady-step gate records next to the wall time: the process's CPU time,
    its thread count, the device kind, the 1-minute load average and the usable cores. On a
    GPU the process waits for the device, so only the load average can say "loaded".
    """
    wall, cpu = measurements.get("step_seconds"), measurements.get("step_cpu_seconds")
    load, cores = measurements.get("load_average"), measurements.get("cpu_cores")
    why = []
    if isinstance(load, int | float) and isinstance(cores, int) and load > cores:
        why.append(f"load average {load:.1f} above the {cores} cores")
    threads = measurements.get("threads") or 1
    on_cpu = measurements.get("device_type", "cpu") == "cpu"
    if on_cpu and isinstance(wall, int | float) and isinstance(cpu, int | float) and wall > 0:
        share = cpu / (wall * threads)
        if share < NOISY_CPU_SHARE:
            why.append(f"{wall:.3g} s wall for {cpu:.3g} s of CPU time on {threads} thread(s) "
                       f"({share:.0%} of the cores' time)")  # fmt: skip
    return "; ".join(why) or None


def computed_seconds(
    card: GpuCard, catalog: Catalog, flops: WorkFlops, io: WorkBytes, *, note: str = ""
) -> PhaseSeconds | None:
    """Seconds from FLOPs and bytes on `card`; None when the card lacks the precision."""
    peak = card.peak_flops(flops.precision)
    if peak is None:
        return None
    mfu, disk = catalog.mfu(card), catalog.assumed_disk_gb_s * 1e9
    rate = peak * mfu
    update, eval_pass = flops.per_update / rate, flops.per_eval_pass / rate
    checkpoint = io.checkpoint / disk
    resume = (io.base_weights + io.checkpoint) / disk + update
    export = (io.export + io.base_weights + io.export) / disk
    basis = (
        f"computed, not measured: {flops.per_update:.3g} FLOPs per update / ("
        f"{peak / 1e12:g} TFLOPS {flops.precision} peak of the {card.name} x {mfu:.0%} MFU, an "
        f"ASSUMPTION until a pilot on the {card.name} measures the step); checkpoint "
        f"({human_bytes(io.checkpoint)}), resume and export from bytes at an ASSUMED "
        f"{catalog.assumed_disk_gb_s:g} GB/s disk"
    ) + (f"; {note}" if note else "")
    assumptions = [
        f"MFU {mfu:.0%} of the {card.name}'s dense {flops.precision} peak ({card.source})",
        f"disk {catalog.assumed_disk_gb_s:g} GB/s for checkpoints, resume and export",
    ]
    return PhaseSeconds(card.name, update, eval_pass, checkpoint, resume, export, False, basis,
                        assumptions)  # fmt: skip


def measured_seconds(
    card: GpuCard, measurements: dict[str, Any], pilot_id: str
) -> PhaseSeconds | None:
    """The pilot's own times on `card`, or None when it did not measure them all."""
    needed = ("step_seconds", "eval_seconds", "checkpoint_seconds")
    if not all(isinstance(measurements.get(k), int | float) for k in needed):
        return None
    m = measurements
    basis = (
        f"measured by pilot {pilot_id} on the {card.name}: {m['step_seconds']:.3g} s per update "
        f"(median of the steady steps, the longest examples), {m['eval_seconds']:.3g} s per "
        "validation pass, checkpoint, resume and export as timed there"
    )
    return PhaseSeconds(card.name, float(m["step_seconds"]), float(m["eval_seconds"]),
                        float(m["checkpoint_seconds"]), float(m.get("resume_seconds") or 0.0),
                        float(m.get("export_seconds") or 0.0), True, basis)  # fmt: skip


def seconds_on(
    card: GpuCard,
    catalog: Catalog,
    flops: WorkFlops | None,
    io: WorkBytes | None,
    *,
    measured_on: str | None = None,
    measurements: dict[str, Any] | None = None,
    pilot_id: str = "",
) -> tuple[PhaseSeconds | None, str]:
    """(seconds, sentence) for `card`: the pilot's measurement when it ran on this card on a
    quiet machine, else FLOPs over the assumed utilisation; None with the reason otherwise."""
    note = ""
    if measured_on is not None and measured_on.lower() == card.name.lower() and measurements:
        noisy = noise_of(measurements)
        found = None if noisy else measured_seconds(card, measurements, pilot_id)
        if found is not None:
            return found, found.basis
        loaded = f"pilot {pilot_id} on this card ran on a loaded machine ({noisy}): not used"
        note = loaded if noisy else f"pilot {pilot_id} on this card did not time every phase"
    if flops is None or io is None:
        return None, "no hours: no dry run counted the step's FLOPs" + (f"; {note}" if note else "")
    if not (math.isfinite(flops.per_update) and flops.per_update > 0):
        return None, "no hours: the dry run counted no FLOPs for the step"
    found = computed_seconds(card, catalog, flops, io, note=note)
    if found is None:
        return None, f"no hours: the {card.name} has no {flops.precision} (see its datasheet)"
    return found, found.basis
