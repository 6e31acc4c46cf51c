"""The pilot (S1, S4-S7, D7, D9, B1, L1-L3): 13 gates on a tiny real campaign, the rows they
write, the out-of-memory path, staleness after a backend change, and the plan command.

The campaign is the generated ticket data (no time field, so no time-overlap warning) on a
tiny BERT built from config; everything runs for real, child processes included. torch runs
on one thread here: the machine is shared and two threads fight over two busy cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pilot_support import GATE_NAMES as NAMES
from pilot_support import one_torch_thread, tiny_campaign  # noqa: F401  (autouse fixture)
from tunepilot.data.workspace import Workspace
from tunepilot.pilot.flow import GATES, execute_pilot, new_pilot_folder, new_state
from tunepilot.pilot.phases import PilotHooks, run_gate

torch = pytest.importorskip("torch")

def run_gates(ws: Workspace, names: list[str], hooks: PilotHooks | None = None) -> dict:
    """Gates in order up to the last of `names` (with what they need), through the real runner."""
    pilot_id, folder = new_pilot_folder(ws.pilots_dir)
    state = new_state(ws, pilot_id, folder, tensors=False, hooks=hooks)
    rows: dict = {}
    last = max(NAMES.index(n) for n in names)
    for gate in GATES[: last + 1]:
        rows[gate.name] = run_gate(state, gate, rows)
    return rows


@pytest.fixture(scope="module")
def pilot(tmp_path_factory: pytest.TempPathFactory):
    path = tiny_campaign(tmp_path_factory.mktemp("pilot"))
    ws = Workspace.open(path)
    return ws, execute_pilot(ws)


def test_s4_tiny_campaign_passes_all_13_gates_in_order(pilot) -> None:
    _, result = pilot
    assert [r.phase for r in result.rows] == NAMES
    assert [r.number for r in result.rows] == list(range(1, 14))
    bad = {r.phase: r for r in result.rows if r.verdict != "PASS"}
    # The generated tickets repeat stock closing messages across queues: the audit WARNs that
    # drop_exact_duplicates kept one queue's label and dropped the others' (D2, D6). Nothing
    # else may be below PASS.
    assert set(bad) <= {"data"}, {k: r.sentence for k, r in bad.items()}
    if "data" in bad:
        found = {f["check"]: f for f in bad["data"].details["findings"]}
        below = {c: f["verdict"] for c, f in found.items() if f["verdict"] != "PASS"}
        assert below == {"conflicting labels": "WARN"}, below
        assert found["conflicting labels"]["details"]["hidden_by_dedup"] > 0
    assert not result.failed


def test_s5_every_row_has_inputs_memory_duration_verdict_sentence_and_spec_ids(pilot) -> None:
    _, result = pilot
    for row in result.rows:
        assert set(row.inputs) == {"microbatch", "length", "precision", "accumulation",
                                   "activation_checkpointing", "world_size"}  # fmt: skip
        assert row.duration_s is not None and row.duration_s >= 0
        assert row.sentence and row.requirement
        readings = {r["counter"]: r for r in row.memory["readings"]}
        rss = readings["rss"]  # CPU: the phase's peak RSS from one probe
        assert rss["peak_delta_bytes"] == rss["peak_bytes"] - rss["baseline_bytes"]
        assert rss["peak_bytes"] >= rss["baseline_bytes"] > 0
    step = result.rows[NAMES.index("first step")]
    longest = max(len(e.input_ids) for e in _train(pilot))
    assert step.inputs["length"] == longest and step.inputs["microbatch"] == 2
    assert "optimizer state allocated" in step.sentence


def _train(pilot) -> list:
    from tunepilot.campaign.variants import CONTROL
    from tunepilot.experiments.runner import Session, run_campaign_for

    ws, _ = pilot
    return Session(ws).encoded(run_campaign_for(ws, CONTROL, 0)).train


def test_s5_gates_json_holds_rows_env_config_hash_and_data_version(pilot) -> None:
    ws, result = pilot
    saved = json.loads((result.folder / "gates.json").read_text())
    assert saved["pilot_id"] == result.pilot_id and result.pilot_id.startswith("p-")
    assert saved["config_hash"] == ws.campaign.config_hash()
    assert saved["data_version"] and saved["env"]["torch"]["version"] == torch.__version__
    assert [r["phase"] for r in saved["rows"]] == NAMES
    assert saved["verdict"] == max((r["verdict"] for r in saved["rows"]),
                                   key=["PASS", "WARN", "FAIL"].index) != "FAIL"
    samples = json.loads((result.folder / "samples.json").read_text())
    assert samples and all(s["tokens"] for s in samples)
    assert "loss on label" in (result.folder / "samples.txt").read_text()
    # the pilot keeps measurements, not weights
    assert not list(result.folder.rglob("*.safetensors"))


def test_d7_overfit_row_states_its_sizes_and_that_it_is_not_generalisation(pilot) -> None:
    _, result = pilot
    row = result.rows[NAMES.index("overfit")]
    assert "the 8 shortest training examples" in row.sentence
    assert "not a claim about generalisation" in row.sentence
    assert row.details["recovered"] == row.details["total"] == 8
    losses = row.details["losses"]
    assert losses[-1] * 4 <= losses[0]


def test_s2_accumulation_row_states_its_tolerance(pilot) -> None:
    _, result = pilot
    row = result.rows[NAMES.index("accumulation")]
    assert row.details["relative"] <= row.details["rtol"] == 1e-4
    assert "8 microbatches of 2 equal one batch of 16" in row.sentence


def test_r1_resume_row_compares_a_new_process_bitwise(pilot) -> None:
    _, result = pilot
    row = result.rows[NAMES.index("resume")]
    child, parent = row.details["child"], row.details["parent"]
    assert child["restored_update"] == 2 and row.details["exact"]
    assert child["metrics"]["3"]["loss"] == parent["3"]["loss"]
    assert child["metrics"]["4"]["lr"] == parent["4"]["lr"]
    assert "bitwise equal" in row.sentence


def test_l1_l3_pilot_writes_sizing_and_plan_with_the_holdout_error(pilot) -> None:
    _, result = pilot
    from tunepilot.pilot.memory_fit import NOISE_FLOOR_SHARE, fit_memory_model

    ws, _ = pilot
    sizing = json.loads((result.folder / "sizing.json").read_text())
    assert sizing["updates"]["examples_per_update"] == 16
    # The verdict is on the activation part, and follows from the recorded grid alone:
    # recomputed here from the measured points, never read back from the check itself.
    held = sizing["holdout"]
    points = [tuple(p) for p in sizing["memory_grid"]]
    shape = (max(2, ws.campaign.training.microbatch), ws.campaign.data.max_length)
    assert len(points) >= 4 and (held["microbatch"], held["length"]) == shape  # the configured
    rest = fit_memory_model([p for p in points if p[:2] != shape])
    measured = next(p for mb, n, p in points if (mb, n) == shape)
    peaks = [p for *_, p in points]
    floor = NOISE_FLOOR_SHARE * max(peaks)
    part = measured - rest.fixed
    invisible = (max(peaks) - min(peaks) <= floor or part <= floor
                 or rest.per_token == rest.per_token_length == 0)  # fmt: skip
    if invisible:
        assert held["verdict"] == "cannot validate" and "PASS" not in held["sentence"]
    else:
        error = abs(rest.predict(*shape) - measured) / part
        assert held["verdict"] == ("PASS" if error <= held["goal"] else "WARN"), held
    plan = (result.folder / "plan.md").read_text()
    assert "Held-out check" in plan and "`tunepilot plan " in plan
    assert "NOT scaled" not in plan and "scaled x" not in plan


def test_s5_steady_step_records_cpu_time_and_load_next_to_wall_time(pilot) -> None:
    _, result = pilot
    m = result.payload["measurements"]
    assert m["step_seconds"] > 0 and m["step_cpu_seconds"] > 0
    assert m["threads"] == 1 and m["device_type"] == "cpu" and m["cpu_cores"] >= 1
    assert isinstance(m["load_average"], float)


def test_b1_l3_plan_hours_for_a_card_never_come_from_the_cpu_pilot(pilot) -> None:
    """The real plan flow on the real pilot's record, with hand-made dry runs (fast)."""
    from sizing_support import fake_dry_run
    from tunepilot.pilot.plan import build_plan

    ws, result = pilot
    out, lines = build_plan(ws, gpu="A100 40GB", catalog=None, pilot=result.payload,
                            runner=fake_dry_run)  # fmt: skip
    assert out["pilot_id"] == result.pilot_id and out["target"] == "A100 40GB"
    assert out["measured_on"] == "cpu" and out["plan"]["measured"] is False
    assert out["plan"]["basis"].startswith("computed")
    step = result.payload["measurements"]["step_seconds"]
    assert out["plan"]["workload"]["seconds_per_update"] != pytest.approx(step)
    assert out["recommendation"] is None  # L2: the stack was checked on cpu, not on a GPU
    assert "not recommended yet" in out["recommendation_sentence"]
    text = "\n".join(lines)
    assert text.startswith("## Per-card sheet") and "## Rental plan on the A100 40GB" in text
    assert text.count("Basis:") == 1
    # B1: the plan itself says the CPU pilot's times are not used for any card
    assert f"pilot {result.pilot_id} timed its step on cpu" in text
    assert "never used as a GPU's" in text


def test_l3_plan_needs_no_pilot_and_a_card_missing_from_the_catalog_exits_2(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    path = tiny_campaign(tmp_path)
    cmd = [sys.executable, "-m", "tunepilot.cli", "plan", str(path), "--gpu", "B300"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "gpus.yaml" in done.stderr and "no card `B300`" in done.stderr
    assert "--catalog" in done.stderr and "Traceback" not in done.stderr


def test_s6_out_of_memory_raised_by_a_test_hook_is_named_with_shape_and_proposals(
    tmp_path: Path,
) -> None:
    """A real torch.OutOfMemoryError raised inside the first step (the injection is the
    test's; the error type and the handling are real). The pilot continues."""

    def oom(phase: str) -> None:
        if phase == "first step":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    ws = Workspace.open(tiny_campaign(tmp_path))
    rows = run_gates(ws, ["accumulation"], PilotHooks(before_forward=oom))
    row = rows["first step"]
    assert row.verdict == "FAIL" and row.details["out_of_memory"]
    assert row.inputs["microbatch"] == 2 and row.inputs["length"] > 0
    assert f"out of memory in first step at microbatch 2 x length {row.inputs['length']}" in (
        row.sentence
    )
    proposals = row.details["proposals"]
    assert proposals[0].startswith("1) training.microbatch=1 with training.accumulation=16")
    assert "activation_checkpointing" in proposals[1] and "bf16" in proposals[2]
    assert "fsdp" in proposals[3] and "max_length" in proposals[4]
    assert rows["steady step"].verdict == "FAIL"
    assert rows["steady step"].sentence.startswith("not run: first step failed")
    assert rows["accumulation"].verdict == "PASS"  # what can still be checked is checked


def test_b1_backend_change_marks_the_earlier_pilot_stale(tmp_path: Path) -> None:
    ws = Workspace.open(tiny_campaign(tmp_path))
    first = run_gates(ws, ["environment"])["environment"]
    assert first.verdict == "PASS" and first.details["backend"] == "cpu"
    old = sorted(ws.pilots_dir.iterdir())[-1]
    (old / "gates.json").write_text(json.dumps({"env": _other_backend(), "rows": []}))
    second = run_gates(ws, ["environment"])["environment"]
    assert second.verdict == "WARN"
    assert f"the backend changed since pilot {old.name}" in second.sentence
    assert "torch.version" in second.sentence and "redo every pilot gate" in second.sentence
    stale = json.loads((old / "STALE.json").read_text())
    assert any(line.startswith("torch.version") for line in stale["backend_changes"])


def _other_backend() -> dict:
    from tunepilot.measure.env import fingerprint

    env = fingerprint()
    env["torch"]["version"] = "2.99.0+cu999"
    return env


def test_l2_extensions_the_campaign_names_are_exercised_or_fail_with_the_fix(
    tmp_path: Path,
) -> None:
    ws = Workspace.open(tiny_campaign(tmp_path, **{"model.attn_implementation": "sdpa"}))
    row = run_gates(ws, ["environment"])["environment"]
    assert row.verdict == "PASS" and "sdpa" in row.sentence
    flash = {"model.attn_implementation": "flash_attention_2", "training.precision": "fp16"}
    ws = Workspace.open(tiny_campaign(tmp_path / "fa", **flash))
    row = run_gates(ws, ["environment"])["environment"]
    assert row.verdict == "FAIL"
    assert "flash_attention_2 needs a CUDA GPU" in row.sentence
    assert "training.precision=fp16 needs CUDA" in row.sentence


def test_s4_a_gate_that_cannot_run_is_a_fail_saying_why_never_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tunepilot.pilot.flow import run_pilot

    ws = Workspace.open(tiny_campaign(tmp_path, **{"model.lora.target_modules": ["q_proj"]}))
    assert run_pilot(ws, as_json=True) == 1  # a FAIL exits 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["verdict"] == "FAIL" and len(printed["rows"]) == 13
    result = execute_pilot(ws)
    verdicts = {r.phase: r.verdict for r in result.rows}
    assert verdicts["load"] == "FAIL" and len(result.rows) == 13
    for name in NAMES[NAMES.index("update audit") :]:
        row = result.rows[NAMES.index(name)]
        assert row.verdict == "FAIL" and row.details["not_run"], name
        assert "load failed" in row.sentence
    sentence = json.loads((result.folder / "sizing.json").read_text())["sentence"]
    assert "not sized here: the model did not load" in sentence


def test_s5_tensors_flag_adds_profiler_tensor_bytes_as_their_own_column(tmp_path: Path) -> None:
    from rich.console import Console

    from tunepilot.pilot.phases import gate_table

    ws = Workspace.open(tiny_campaign(tmp_path))
    pilot_id, folder = new_pilot_folder(ws.pilots_dir)
    state = new_state(ws, pilot_id, folder, tensors=True, hooks=None)
    rows: dict = {}
    for gate in GATES[: NAMES.index("first step") + 1]:
        rows[gate.name] = run_gate(state, gate, rows)
    step = rows["first step"]
    assert step.verdict == "PASS"
    counters = {r["counter"]: r for r in step.memory["readings"]}
    assert set(counters) == {"rss", "tensors"}
    assert counters["tensors"]["peak_bytes"] > 0  # AdamW state and activations, as tensors
    console = Console(record=True, width=250)
    console.print(gate_table(list(rows.values()), "t"))
    text = console.export_text()
    assert "RSS peak" in text and "tensor bytes" in text


class FakeCuda:
    """Stands in for `torch.cuda` (no GPU here): fixed allocator counters for one device."""

    def __init__(self) -> None:
        self.alloc, self.res = 100 * 2**20, 128 * 2**20

    def device_count(self) -> int:
        return 1

    def synchronize(self, device: int) -> None:
        self.alloc += 0

    def reset_peak_memory_stats(self, device: int) -> None:
        self.alloc += 0

    def memory_allocated(self, device: int) -> int:
        return self.alloc

    def memory_reserved(self, device: int) -> int:
        return self.res

    def max_memory_allocated(self, device: int) -> int:
        return self.alloc + 50 * 2**20

    def max_memory_reserved(self, device: int) -> int:
        return self.res + 64 * 2**20


def test_s5_cuda_rows_keep_allocated_and_reserved_apart_with_a_fake_cuda_device(
    tmp_path: Path,
) -> None:
    """The probe reads a fake `torch.cuda` (no GPU on this machine); the row and the table must
    show allocated and reserved as two columns, never their sum."""
    from rich.console import Console

    from tunepilot.measure.memory import MemoryProbe
    from tunepilot.pilot.phases import gate_table

    ws = Workspace.open(tiny_campaign(tmp_path))
    pilot_id, folder = new_pilot_folder(ws.pilots_dir)
    state = new_state(ws, pilot_id, folder, tensors=False, hooks=None)
    state.probe = MemoryProbe.for_device("cuda:0", cuda_api=FakeCuda())
    row = run_gate(state, GATES[0], {})
    readings = {r["counter"]: r for r in row.memory["readings"]}
    assert readings["allocated"]["peak_bytes"] == 150 * 2**20
    assert readings["reserved"]["peak_bytes"] == 192 * 2**20
    assert readings["allocated"]["peak_delta_bytes"] == 50 * 2**20
    console = Console(record=True, width=250)
    console.print(gate_table([row], "t"))
    text = console.export_text()
    assert "allocated peak" in text and "reserved peak" in text and "RSS" not in text
    assert "150.00 MiB" in text and "192.00 MiB" in text and "342.00 MiB" not in text


def test_s3_pilot_keeps_one_grad_scaler_across_updates_exactly_as_training(
    tmp_path: Path,
) -> None:
    """fp16 needs CUDA; the scaler's bookkeeping is the same on CPU (torch.amp.GradScaler("cpu")),
    so a real one is handed to the pilot's update here, as the loop holds one per run."""
    import copy

    from tunepilot.pilot.gates import data_gate, load_gate
    from tunepilot.pilot.update import longest_microbatches, make_optimizer, train_update

    ws = Workspace.open(tiny_campaign(tmp_path))
    pilot_id, folder = new_pilot_folder(ws.pilots_dir)
    state = new_state(ws, pilot_id, folder, tensors=False, hooks=None)
    data_gate(state)
    load_gate(state)
    update = longest_microbatches(state.encoded.train, 2, 1)
    twin = copy.deepcopy(state.model)

    state.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    optimizer = make_optimizer(state.model, state.training)
    scaled = [train_update(state, update, optimizer, 1e-3) for _ in range(2)]
    assert state.scaler.get_scale() == 2.0**12  # one scaler, stepped and updated each update

    state.model, state.scaler = twin, None
    optimizer = make_optimizer(twin, state.training)
    plain = [train_update(state, update, optimizer, 1e-3) for _ in range(2)]
    assert state.scaler is None
    for (loss_s, norm_s), (loss_p, norm_p) in zip(scaled, plain, strict=True):
        assert loss_s == pytest.approx(loss_p, rel=1e-6)
        assert norm_s == pytest.approx(norm_p, rel=1e-6)  # clipping saw unscaled gradients
