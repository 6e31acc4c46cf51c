"""Seconds per unit of campaign work on one card (L3, B1, L2): measured there, or computed.

Two sources, never mixed within a card, and one sentence that says which:

- **measured**: a pilot ran on this very card and its steady-step time was taken on a quiet
  machine. Its update, evaluation, checkpoint, resume and export times are used as they are.
- **computed**: FLOPs counted on the dry run of the campaign's exact step, divided by the
  card's public dense peak for each precision times the utilisation calibrated on published
  measurements for the method (`sizing.throughput`: LoRA, QLoRA with its dequantisation, full
  fine-tuning), with its low/expected/high range; the user's own `mfu` in the catalog replaces
  the model. Checkpoint save, resume and export are I/O and come from their bytes over an
  assumed disk speed. Every figure is named in the sentence.

A time measured on a CPU is never used for a GPU: the two do not scale into each other by any
factor worth trusting. A measurement taken while the machine was loaded (wall time far above
the process's CPU time, or a load average above the core count) is flagged noisy and not used.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

from tunepilot.measure.memory import human_bytes
from tunepilot.sizing.catalog import Catalog, GpuCard

NOISY_CPU_SHARE = 0.5
"""On a CPU step, the process's CPU time over (wall time x its threads) below this means it
spent more than half its wall time waiting for a core: other work was running."""


@dataclass(frozen=True)
class WorkFlops:
    """What the campaign computes, counted on the dry run of its exact step, split by the
    precision each operator computed in (a bf16 base runs its matmuls in bf16 even with
    training.precision fp32; fp32 LoRA weights run theirs in fp32; autocast moves both)."""

    per_update: float  # forward + backward of every microbatch of one update, optimizer step
    per_eval_pass: float  # one full validation pass (every batch at the longest length)
    precision: str  # the precision most of the update's FLOPs run in
    update_by: dict[str, float] = field(default_factory=dict)  # per_update per precision
    eval_by: dict[str, float] = field(default_factory=dict)  # per_eval_pass per precision
    method: str = "lora"  # "lora" | "qlora" | "full": which calibrated utilisation applies
    dequant_bytes: float = 0.0  # bytes QLoRA's dequantisation moves per update

    def split(self, part: str = "update") -> dict[str, float]:
        """FLOPs per precision of one update (or one validation pass)."""
        total, by = ((self.per_update, self.update_by) if part == "update"
                     else (self.per_eval_pass, self.eval_by))  # fmt: skip
        return {k: v for k, v in by.items() if v} if by else {self.precision: total}

    def shares(self) -> str:
        """The update's FLOPs by precision, largest first: "99.9% bf16, 0.1% fp32"."""
        split = self.split()
        total = sum(split.values()) or 1.0
        ordered = sorted(split.items(), key=lambda kv: -kv[1])
        return ", ".join(f"{v / total:.1%} {k}" for k, v in ordered)


def work_flops(update_by: dict[str, float], eval_by: dict[str, float], method: str = "lora",
               dequant_bytes: float = 0.0) -> WorkFlops:  # fmt: skip
    """WorkFlops from the FLOPs per precision of one update and one validation pass."""
    update_by = {k: float(v) for k, v in update_by.items() if v}
    eval_by = {k: float(v) for k, v in eval_by.items() if v}
    main = max(update_by, key=lambda k: update_by[k]) if update_by else "fp32"
    return WorkFlops(sum(update_by.values()), sum(eval_by.values()), main, update_by, eval_by,
                     method, float(dequant_bytes))  # fmt: skip


class WorkBytes(NamedTuple):
    """What the I/O phases move: a checkpoint, the base weights a new process loads, the export;
    and what the GPU must at least read from its memory per update and per validation pass
    (every weight once per forward, backward and recompute of each microbatch, and once per
    generated token), which floors the time where the matmuls are too small to be bound by
    FLOPs (a microbatch of a few hundred tokens; every decoding step)."""

    checkpoint: int
    base_weights: int
    export: int
    update_reads: int = 0
    eval_reads: int = 0


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
    spread: tuple[float, float] = (1.0, 1.0)  # (fast, slow) factors on update and eval times

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def scaled(self, factor: float) -> PhaseSeconds:
        """The same work with the compute phases (update, validation pass, the update inside
        resume) `factor` times as long: the ends of the utilisation range, or a layout."""
        extra = (factor - 1.0) * self.update
        return replace(self, update=self.update * factor, eval_pass=self.eval_pass * factor,
                       resume=self.resume + extra)  # fmt: skip


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
    """Seconds from FLOPs and bytes on `card`; None when the card lacks a precision the step
    computes in. Each precision's FLOPs run at that precision's dense peak x the utilisation
    (the calibrated model for the method, or the user's own `mfu`); QLoRA adds its
    dequantisation at the card's bandwidth."""
    from tunepilot.sizing.throughput import Utilisation, dequant_seconds, utilisation

    precisions = {*flops.split("update"), *flops.split("eval")}
    peaks = {p: card.peak_flops(p) for p in sorted(precisions, key=_by_size(flops))}
    if any(v is None for v in peaks.values()):
        return None
    own = catalog.mfu(card)
    util = (Utilisation(own, own, own, f"your own figure for the {card.name} (catalog mfu)")
            if own is not None else utilisation(flops.method, flops.precision))  # fmt: skip
    mfu, disk = util.expected, catalog.assumed_disk_gb_s * 1e9

    def seconds(split: dict[str, float]) -> float:
        return sum(n / (peaks[p] * mfu) for p, n in split.items())  # type: ignore[operator]

    bandwidth = card.bandwidth_gb_s * 1e9
    dequant = dequant_seconds(flops.dequant_bytes, card.bandwidth_gb_s)
    compute = seconds(flops.split("update")) + dequant, seconds(flops.split("eval"))
    reads = io.update_reads / bandwidth, io.eval_reads / bandwidth
    update, eval_pass = max(compute[0], reads[0]), max(compute[1], reads[1])
    bound = [w for w, c, r in zip(("the update", "the validation pass"), compute, reads,
                                  strict=True) if r > c]  # fmt: skip
    checkpoint = io.checkpoint / disk
    resume = (io.base_weights + io.checkpoint) / disk + update
    export = (io.export + io.base_weights + io.export) / disk
    said = ", ".join(f"{v / 1e12:g} TFLOPS {p}" for p, v in peaks.items() if v)
    basis = (
        f"computed, not measured: {flops.per_update:.3g} FLOPs per update ({flops.shares()}) / "
        f"(the {card.name}'s dense peak, {said}, x {mfu:.0%} utilisation for {flops.method}: "
        f"{util.basis}; range {util.low:.0%}-{util.high:.0%}; a pilot on the {card.name} "
        f"replaces it by the measured step)"
    )
    if dequant:
        from tunepilot.sizing.throughput import DEQUANT_SHARE

        basis += (f"; + {dequant:.3g} s per update dequantizing the {flops.dequant_bytes / 1e9:.3g}"
                  f" GB of quantized weights each pass moves, at {DEQUANT_SHARE:.0%} of the "
                  f"{card.name}'s {card.bandwidth_gb_s:g} GB/s (calibrated)")  # fmt: skip
    basis += (f"; checkpoint ({human_bytes(io.checkpoint)}), resume and export from bytes at an "
              f"ASSUMED {catalog.assumed_disk_gb_s:g} GB/s disk")  # fmt: skip
    if io.update_reads or io.eval_reads:
        which = " and ".join(bound) + (" is" if len(bound) == 1 else " are") if bound else "none is"
        basis += (f"; never faster than reading the weights at the {card.name}'s "
                  f"{card.bandwidth_gb_s:g} GB/s (each microbatch's forward and backward, each "
                  f"generated token): {which} memory-bound here")  # fmt: skip
    basis += f"; {note}" if note else ""
    assumptions = [
        f"utilisation {mfu:.0%} of the {card.name}'s dense peak ({card.source}): {util.basis}",
        f"disk {catalog.assumed_disk_gb_s:g} GB/s for checkpoints, resume and export",
    ]
    return PhaseSeconds(card.name, update, eval_pass, checkpoint, resume, export, False, basis,
                        assumptions, util.spread())  # fmt: skip


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
        lacking = [p for p in flops.split() if card.peak_flops(p) is None] or [flops.precision]
        return None, (f"no hours: the {card.name} has no {', '.join(lacking)} (see its "
                      "datasheet), which the step computes in")  # fmt: skip
    return found, found.basis


def _by_size(flops: WorkFlops) -> Any:
    """Sort key: the precision with the most FLOPs of an update first."""
    split = flops.split()
    return lambda p: -split.get(p, 0.0)
