"""The pilot's machinery: what a gate is, the state the gates share, and how one gate is run,
measured and judged (S4, S5, S6).

Every gate runs inside the *one* memory probe of the pilot (S5: the same bounds for every
phase) and ends as a `GateRow`: the phase, its input shape, memory (baseline, absolute peak,
peak minus baseline; on CUDA allocated and reserved are separate columns, never summed), its
device-synchronised duration, PASS / WARN / FAIL and one sentence.

What happens when a gate cannot finish is decided here, once:
- out of memory (S6): the row names the phase and its input shape and proposes that phase's
  own knobs (`pilot.oom_advice`: a training step's microbatch, checkpointing, precision,
  sharding; evaluation's eval batch and longest validation example); the pilot goes on with
  what can still be checked;
- a set-up that would train silently wrong (`SetupFailure`) or bad input (`InputError`):
  FAIL with its own sentence;
- anything else: FAIL naming the exception, with the traceback kept in gates.json.

A gate whose prerequisite failed is not run and is reported as FAIL "not run: <gate>
failed". FAIL, not WARN: the pilot exists to prove that each operation ran; a gate that did
not run proves nothing, so the recommendation must stay blocked (DESIGN: a FAIL stops the
pilot's recommendation, never silently), and WARN would let `tunepilot pilot` exit 0 with an
operation never tried.
"""

from __future__ import annotations

import gc
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunepilot.errors import InputError
from tunepilot.measure.memory import MemoryProbe, human_bytes, is_out_of_memory
from tunepilot.pilot.oom_advice import oom_proposals
from tunepilot.progress import start_line
from tunepilot.verdict import Verdict

if TYPE_CHECKING:
    from tunepilot.campaign import Campaign
    from tunepilot.data.workspace import Workspace


@dataclass
class Outcome:
    """What a gate function returns; the runner adds memory, time and the row around it."""

    verdict: Verdict
    sentence: str
    details: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)  # overrides of the default shape


@dataclass(frozen=True)
class Gate:
    number: int
    name: str
    requirement: str
    run: Callable[[PilotState], Outcome]
    needs: tuple[str, ...] = ()  # gates that must not have FAILed for this one to run


@dataclass
class GateRow:
    """One row of the gate table and of gates.json (S5)."""

    number: int
    phase: str
    inputs: dict[str, Any]
    memory: dict[str, Any] | None
    duration_s: float | None
    verdict: str
    sentence: str
    requirement: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PilotHooks:
    """Injection points for tests. `on_phase_start(name)` runs inside each gate's probe phase;
    `before_forward(name)` inside a step once its input shape is known. An error either raises
    is seen exactly like one from the phase's own work (the S6 out-of-memory tests)."""

    on_phase_start: Callable[[str], None] | None = None
    before_forward: Callable[[str], None] | None = None


@dataclass
class PilotState:
    """Everything the gates build and hand on, in the order they build it."""

    ws: Workspace
    pilot_id: str
    folder: Path
    campaign: Campaign  # the control configuration with its first seed
    seed: int
    device: Any  # torch.device
    probe: MemoryProbe
    hooks: PilotHooks = field(default_factory=PilotHooks)
    env: dict[str, Any] = field(default_factory=dict)
    session: Any = None  # runner.Session
    prepared: Any = None  # PreparedData
    audit: list[Any] = field(default_factory=list)  # audit Findings
    encoded: Any = None  # runner.Encoded: encoder, train and validation encodings
    model: Any = None
    report: Any = None  # params.TrainableReport
    optimizer: Any = None
    scaler: Any = None  # fp16 GradScaler, kept across the pilot's updates as the loop keeps it
    updates_done: int = 0
    eval_metrics: dict[str, Any] = field(default_factory=dict)
    trained_model: Any = None  # the resume gate's model, trained through the real loop
    measurements: dict[str, Any] = field(default_factory=dict)  # for sizing.json / plan.md
    shape: dict[str, Any] = field(default_factory=dict)  # the running gate's input shape
    phase: str = ""  # the running gate

    # -- what every row shares -------------------------------------------------------------
    @property
    def training(self) -> Any:
        return self.campaign.training

    @property
    def kind(self) -> str:
        return "classification" if self.campaign.hypothesis.is_classification else "causal_lm"

    @property
    def pad_id(self) -> int:
        from tunepilot.experiments.evaluate import pad_id_of

        return pad_id_of(self.ws.tokenizer)

    @property
    def packing(self) -> Any:
        """data.packing as the loop builds it for this model (packing.py), or None (padded)."""
        from tunepilot.train.packing import packing_of

        found = packing_of(self.campaign)
        return found.for_model(self.model) if found and self.model is not None else found

    def default_inputs(self) -> dict[str, Any]:
        """The configured shape; the pilot itself is one process, so its world size is 1."""
        t = self.training
        return {
            "microbatch": t.microbatch,
            "length": None,
            "precision": t.precision,
            "accumulation": t.accumulation,
            "activation_checkpointing": t.activation_checkpointing,
            "world_size": 1,
        }


# ---------------------------------------------------------------------------------------------
# running one gate
# ---------------------------------------------------------------------------------------------


def run_gate(state: PilotState, gate: Gate, rows: dict[str, GateRow]) -> GateRow:
    """Run `gate` inside the probe, or report why it was not run; never silently skipped."""
    inputs = state.default_inputs()
    blocked = [n for n in gate.needs if _blocks(state, rows.get(n))]
    if blocked:
        first = rows[blocked[0]]
        root = first.details.get("root", first.phase)
        why = rows[root].sentence[:160].rstrip(".")
        via = f"{blocked[0]} was not run because " if root != blocked[0] else ""
        sentence = f"not run: {via}{root} failed ({why}); fix that first"
        details = {"not_run": True, "blocked_by": blocked, "root": root}
        return GateRow(gate.number, gate.name, inputs, None, None, str(Verdict.FAIL), sentence,
                       gate.requirement, details)  # fmt: skip
    outcome: Outcome | None = None
    error: BaseException | None = None
    record = None
    state.shape, state.phase = {}, gate.name
    start_line(f"pilot gate {gate.number} {gate.name} ...")  # a long pilot is never silent
    try:
        with state.probe.phase(gate.name) as record:
            if state.hooks.on_phase_start is not None:
                state.hooks.on_phase_start(gate.name)
            outcome = gate.run(state)
    except Exception as exc:  # reported as this gate's FAIL row below, never swallowed
        error = exc
    if error is not None:
        outcome = _failure(state, gate, error, inputs)
    assert outcome is not None
    inputs.update(outcome.inputs)
    memory = record.to_json() if record is not None else None
    duration = record.duration_s if record is not None else None
    took = f" in {duration:.1f} s" if duration is not None else ""
    start_line(f"pilot gate {gate.number} {gate.name}: {outcome.verdict}{took}")
    return GateRow(gate.number, gate.name, inputs, memory, duration, str(outcome.verdict),
                   outcome.sentence, gate.requirement, outcome.details)  # fmt: skip


CONTENT_GATES = ("data",)
"""Gates whose FAIL is about the content they checked (leakage, a cut target), not a missing
product: later gates still run on the prepared data, as long as it was prepared."""


def _blocks(state: PilotState, row: GateRow | None) -> bool:
    """Whether a prerequisite's row stops a gate: it FAILed and left nothing to work on."""
    if row is None or row.verdict != Verdict.FAIL:
        return False
    if row.phase in CONTENT_GATES:
        return state.encoded is None
    return True


def _failure(state: PilotState, gate: Gate, exc: BaseException, inputs: dict[str, Any]) -> Outcome:
    """The FAIL outcome of a gate that raised: out of memory, set-up, input, or anything else."""
    from tunepilot.model.build import SetupFailure

    shape = dict(state.shape)  # what the gate was running when it raised
    inputs = {**inputs, **shape}
    if is_out_of_memory(exc):
        _release_memory(state)
        proposals = oom_proposals(state, inputs, gate.name)
        sentence = f"out of memory in {gate.name} at {describe_inputs(inputs)}: " + "; ".join(
            proposals
        )
        details = {"out_of_memory": True, "error": str(exc)[:500], "proposals": proposals}
        return Outcome(Verdict.FAIL, sentence, details, inputs=shape)
    if isinstance(exc, SetupFailure):
        f = exc.finding
        return Outcome(Verdict.FAIL, f.sentence, {"finding": f.to_json()}, inputs=shape)
    if isinstance(exc, InputError):
        text = "; ".join(f"{p.where}: {p.found}; fix: {p.fix}" for p in exc.problems)
        return Outcome(Verdict.FAIL, f"{exc.title}: {text}", {"problems": [
            asdict(p) for p in exc.problems]}, inputs=shape)  # fmt: skip
    trace = traceback.format_exception(type(exc), exc, exc.__traceback__)
    sentence = (
        f"{gate.name} raised {type(exc).__name__}: {str(exc)[:300]}; the traceback is in "
        "gates.json: fix the cause and rerun the pilot"
    )
    details = {"error": repr(exc)[:1000], "traceback": "".join(trace)[-6000:]}
    return Outcome(Verdict.FAIL, sentence, details, inputs=shape)


def _release_memory(state: PilotState) -> None:
    """After an out-of-memory error: drop gradients and cached blocks so later gates can run."""
    import torch

    if state.model is not None:
        for p in state.model.parameters():
            p.grad = None
    gc.collect()
    if state.device is not None and getattr(state.device, "type", "cpu") == "cuda":
        torch.cuda.empty_cache()


def describe_inputs(inputs: dict[str, Any]) -> str:
    """`microbatch 16 x length 128, fp32, accumulation 2, checkpointing off, world size 1`."""
    length = inputs.get("length")
    shape = f"microbatch {inputs['microbatch']}" + (f" x length {length}" if length else "")
    return (
        f"{shape}, {inputs['precision']}, accumulation {inputs['accumulation']}, activation "
        f"checkpointing {'on' if inputs['activation_checkpointing'] else 'off'}, world size "
        f"{inputs['world_size']}"
    )


# ---------------------------------------------------------------------------------------------
# helpers the step gates share
# ---------------------------------------------------------------------------------------------


def synchronize(device: Any) -> None:
    """Wait for queued device work, so a clock reads the work and not its launch."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.synchronize(device)


def worst_verdict(verdicts: list[Verdict]) -> Verdict:
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    return Verdict.WARN if Verdict.WARN in verdicts else Verdict.PASS


# ---------------------------------------------------------------------------------------------
# the gate table (S5)
# ---------------------------------------------------------------------------------------------


def _memory_cell(memory: dict[str, Any] | None, counter: str) -> str:
    """`peak (+delta over baseline)`, the largest over devices; never summed across counters."""
    if not memory:
        return ""
    readings = [r for r in memory.get("readings", []) if r["counter"] == counter]
    if not readings or readings[0]["peak_bytes"] is None:
        return "n/a"
    r = max(readings, key=lambda x: x["peak_bytes"])
    return (f"{human_bytes(r['peak_bytes'])}\n+{human_bytes(r['peak_delta_bytes'])} over "
            f"{human_bytes(r['baseline_bytes'])}")  # fmt: skip


def _inputs_cell(inputs: dict[str, Any]) -> str:
    shape = f"{inputs['microbatch']}" + (f"x{inputs['length']}" if inputs.get("length") else "")
    ckpt = " ckpt" if inputs["activation_checkpointing"] else ""
    rest = f"acc {inputs['accumulation']} w{inputs['world_size']}{ckpt}"
    return f"{shape} {inputs['precision']}\n{rest}"


def gate_table(rows: list[GateRow], title: str) -> Any:
    """The gate table (S5): CUDA allocated and reserved as separate columns, or CPU RSS."""
    from rich.markup import escape
    from rich.table import Table

    from tunepilot.console import VERDICT_STYLE

    counters: list[str] = []
    for r in rows:
        for c in (r.memory or {}).get("counters", []):
            if c not in counters:
                counters.append(c)
    names = {"rss": "RSS peak", "allocated": "allocated peak", "reserved": "reserved peak",
             "tensors": "tensor bytes"}  # fmt: skip
    table = Table(title=title, show_lines=True, expand=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("phase", style="bold", no_wrap=True)
    table.add_column("inputs", no_wrap=True)
    for c in counters:
        table.add_column(names.get(c, c), no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("what was seen / what to do", ratio=1, min_width=40)
    table.add_column("req", style="dim")
    for r in rows:
        time_cell = f"{r.duration_s:.2f} s" if r.duration_s is not None else "-"
        style = VERDICT_STYLE[Verdict(r.verdict)]
        table.add_row(str(r.number), r.phase, _inputs_cell(r.inputs),
                      *[_memory_cell(r.memory, c) for c in counters], time_cell,
                      f"[{style}]{r.verdict}[/]", escape(r.sentence), r.requirement)  # fmt: skip
    return table
