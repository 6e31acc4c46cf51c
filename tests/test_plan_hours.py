"""Hours per card (L3, B1, L2): FLOPs over the card's dense peak and the utilisation calibrated
on published measurements per method (QLoRA's dequantisation counted), or a pilot's own
measurement on that very card taken on a quiet machine; never a CPU time, never a loaded
machine's time."""

from __future__ import annotations

import pytest

from tunepilot.sizing.catalog import load_catalog
from tunepilot.sizing.throughput import DEQUANT_SHARE, FULL, LORA
from tunepilot.sizing.timing import WorkBytes, WorkFlops, noise_of, seconds_on

CATALOG = load_catalog()
H100 = CATALOG.card("H100 80GB")
FLOPS = WorkFlops(per_update=4.0e15, per_eval_pass=2.0e16, precision="bf16")
IO = WorkBytes(checkpoint=200 * 10**6, base_weights=16 * 10**9, export=80 * 10**6)
QUIET = {"step_seconds": 3.0, "eval_seconds": 60.0, "checkpoint_seconds": 2.0,
         "resume_seconds": 40.0, "export_seconds": 30.0, "step_cpu_seconds": 2.9,
         "threads": 1, "load_average": 0.5, "cpu_cores": 16, "device_type": "cuda"}  # fmt: skip


def test_l3_hours_are_flops_over_the_dense_peak_times_the_calibrated_utilisation() -> None:
    seconds, basis = seconds_on(H100, CATALOG, FLOPS, IO)
    rate = 989.4e12 * LORA.expected
    assert seconds.update == pytest.approx(4.0e15 / rate)
    assert seconds.eval_pass == pytest.approx(2.0e16 / rate)
    disk = CATALOG.assumed_disk_gb_s * 1e9
    assert seconds.checkpoint == pytest.approx(200e6 / disk)
    assert seconds.resume == pytest.approx((16e9 + 200e6) / disk + seconds.update)
    assert not seconds.measured
    assert f"x {LORA.expected:.0%} utilisation for lora: calibrated on three published" in basis
    assert "989.4 TFLOPS bf16" in basis and "ASSUMED" in basis and "range 65%-84%" in basis
    assert seconds.spread == pytest.approx((LORA.expected / LORA.high, LORA.expected / LORA.low))
    # fp32 runs on the fp32 units: 67 TFLOPS, not the bf16 tensor-core figure, and says the
    # figure is not calibrated for it.
    fp32, said = seconds_on(H100, CATALOG, WorkFlops(4.0e15, 0.0, "fp32"), IO)
    assert fp32.update == pytest.approx(4.0e15 / (67e12 * LORA.expected))
    assert "NOT calibrated for fp32" in said
    full, _ = seconds_on(H100, CATALOG, WorkFlops(4.0e15, 0.0, "bf16", method="full"), IO)
    assert full.update == pytest.approx(4.0e15 / (989.4e12 * FULL.expected))


def test_l3_qlora_is_timed_as_lora_plus_its_dequantisation_at_the_cards_bandwidth() -> None:
    rtx = CATALOG.card("RTX 4090")
    lora, _ = seconds_on(rtx, CATALOG, FLOPS, IO)
    dequant = 6.0e10  # bytes the dequantisation moves per update
    qlora, basis = seconds_on(rtx, CATALOG, WorkFlops(4.0e15, 2.0e16, "bf16", method="qlora",
                                                      dequant_bytes=dequant), IO)  # fmt: skip
    assert qlora.update - lora.update == pytest.approx(dequant / (1008e9 * DEQUANT_SHARE))
    assert "dequantizing" in basis and "(calibrated)" in basis


def test_l3_a_users_own_mfu_replaces_the_calibrated_model_and_says_so(tmp_path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("assumed_disk_gb_s: 1\ncards:\n  - {name: X1, memory_gib: 80, backend: cuda, "
                    "peak_tflops: {bf16: 1000}, bandwidth_gb_s: 3000, source: sheet, mfu: 0.5}\n")
    mine = load_catalog(path)
    seconds, basis = seconds_on(mine.card("X1"), mine, FLOPS, IO)
    assert seconds.update == pytest.approx(4.0e15 / (1000e12 * 0.5))
    assert "your own figure for the X1" in basis and seconds.spread == (1.0, 1.0)


def test_l3_a_card_without_the_precision_gets_no_hours_and_says_why() -> None:
    seconds, why = seconds_on(CATALOG.card("T4"), CATALOG, FLOPS, IO)
    assert seconds is None and "has no bf16" in why


def test_b1_a_step_time_measured_on_a_cpu_is_never_used_for_a_gpu() -> None:
    on_cpu = QUIET | {"device_type": "cpu"}
    seconds, basis = seconds_on(H100, CATALOG, FLOPS, IO, measured_on="cpu",
                                measurements=on_cpu, pilot_id="p-1")  # fmt: skip
    assert not seconds.measured and seconds.update != pytest.approx(3.0)
    assert basis.startswith("computed")
    none, why = seconds_on(H100, CATALOG, None, None, measured_on="cpu", measurements=QUIET)
    assert none is None and "no dry run" in why


def test_l3_a_pilot_on_the_card_replaces_the_calibrated_model_by_its_measurement() -> None:
    seconds, basis = seconds_on(H100, CATALOG, FLOPS, IO, measured_on="H100 80GB",
                                measurements=QUIET, pilot_id="p-7")  # fmt: skip
    assert seconds.measured and seconds.update == 3.0 and seconds.eval_pass == 60.0
    assert (seconds.checkpoint, seconds.resume, seconds.export) == (2.0, 40.0, 30.0)
    assert "measured by pilot p-7 on the H100 80GB" in basis and "calibrated" not in basis
    other, _ = seconds_on(CATALOG.card("A100 80GB"), CATALOG, FLOPS, IO,
                          measured_on="H100 80GB", measurements=QUIET)  # fmt: skip
    assert not other.measured  # measured on another card: computed, never scaled


def test_s5_a_loaded_machines_measurement_is_flagged_noisy_and_not_used() -> None:
    loaded = QUIET | {"load_average": 40.0}
    assert "load average 40.0 above the 16 cores" in noise_of(loaded)
    seconds, basis = seconds_on(H100, CATALOG, FLOPS, IO, measured_on="H100 80GB",
                                measurements=loaded, pilot_id="p-8")  # fmt: skip
    assert not seconds.measured and "loaded machine" in basis and "not used" in basis
    # On a CPU, a wall time far above the process's CPU time means it waited for a core.
    waited = QUIET | {"device_type": "cpu", "step_seconds": 3.0, "step_cpu_seconds": 1.0,
                      "threads": 2, "load_average": 1.0, "cpu_cores": 2}  # fmt: skip
    assert "17% of the cores' time" in noise_of(waited)
    busy = waited | {"step_cpu_seconds": 5.8}
    assert noise_of(busy) is None
    # On a GPU the process waits for the device: little CPU time is no sign of load.
    assert noise_of(QUIET | {"step_cpu_seconds": 0.1}) is None


def test_s5_the_pilots_steady_step_flags_a_mocked_loaded_machines_timing_as_noisy(
    tmp_path, monkeypatch
) -> None:
    """The gate itself says when its step time was taken on a loaded machine, so neither the
    reader nor the plan takes it for the card's speed."""
    from pilot_support import tiny_campaign
    from tunepilot.data.workspace import Workspace
    from tunepilot.pilot import gates
    from tunepilot.pilot.flow import new_pilot_folder, new_state
    from tunepilot.pilot.update import timing_flag

    ws = Workspace.open(tiny_campaign(tmp_path))
    state = new_state(ws, *new_pilot_folder(ws.pilots_dir), tensors=False, hooks=None)
    for gate in (gates.data_gate, gates.load_gate, gates.first_step_gate):
        gate(state)
    busy = {"step_cpu_seconds": 0.0, "threads": 1, "load_average": 9.0, "cpu_cores": 2,
            "device_type": "cpu"}  # fmt: skip
    monkeypatch.setattr(gates, "machine_load", lambda device, cpu: busy)
    outcome = gates.steady_step_gate(state)
    assert "timing NOISY" in outcome.sentence and "load average 9.0 above the 2 cores" in (
        outcome.sentence)
    assert outcome.details["timing_noisy"] is True and "not used for hours" in outcome.sentence
    assert timing_flag(QUIET) == ""


def test_l3_an_update_is_never_faster_than_reading_the_weights_at_the_cards_bandwidth():
    """Small microbatches and every decoding step are memory-bound: the FLOPs time is floored
    by the bytes the card must read (datasheet bandwidth), and the basis says which is."""
    small = WorkFlops(per_update=1.0e12, per_eval_pass=1.0e12, precision="bf16")
    reads = IO._replace(update_reads=2 * 16 * 10**9 * 8, eval_reads=16 * 10**9)
    seconds, basis = seconds_on(H100, CATALOG, small, reads)
    assert seconds.update == pytest.approx(2 * 16e9 * 8 / (H100.bandwidth_gb_s * 1e9))
    assert seconds.update > 1.0e12 / (989.4e12 * LORA.expected)
    assert "the update and the validation pass are memory-bound here" in basis
    big = WorkFlops(per_update=4.0e17, per_eval_pass=4.0e17, precision="bf16")
    seconds, basis = seconds_on(H100, CATALOG, big, reads)
    assert seconds.update == pytest.approx(4.0e17 / (989.4e12 * LORA.expected))
    assert "none is memory-bound" in basis
