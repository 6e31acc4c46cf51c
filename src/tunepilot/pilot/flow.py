"""`tunepilot pilot` and `tunepilot plan`: the command bodies (S1, S4-S7, D7, D9, B1, L1-L3).

`run_pilot` runs the 13 gates in order on the campaign's control configuration, each inside
the one memory probe (and a DDP or FSDP campaign's step gates again in real torchrun ranks,
gate 14, replicas.py), and writes `pilots/<pilot-id>/`:

    gates.json     one row per phase + backend fingerprint + config hash + data version
    samples.json   the rendered inspect samples (and samples.txt for a person)
    sizing.json    memory grid, fitted memory model, selection sheet, updates arithmetic
    plan.md        the rental plan and the recommendation (or why there is none)

The pilot keeps its measurements, not its weights: the checkpoint, resume and export folders
it wrote are deleted once measured (their manifests and metrics stay in gates.json).

The pilot measures; `tunepilot plan` sizes (pilot/plan.py): it adds the per-card sheet and the
package to the latest pilot's sizing.json and plan.md when that pilot measured the same
configuration.
"""

from __future__ import annotations

import secrets
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict, Unpack

from tunepilot.campaign import stable_hash
from tunepilot.console import json_safe
from tunepilot.data.workspace import Workspace
from tunepilot.errors import write_json_atomic
from tunepilot.measure.memory import MemoryProbe
from tunepilot.pilot.child import export_gate, resume_gate
from tunepilot.pilot.gates import (
    accumulation_gate,
    checkpoint_gate,
    data_gate,
    evaluation_gate,
    first_step_gate,
    inspect_gate,
    load_gate,
    steady_step_gate,
    update_audit_gate,
)
from tunepilot.pilot.overfit import overfit_gate
from tunepilot.pilot.phases import Gate, GateRow, PilotHooks, PilotState, gate_table, run_gate
from tunepilot.pilot.replicas import replicas_gate, replicated
from tunepilot.pilot.stale import environment_gate
from tunepilot.progress import Progress
from tunepilot.verdict import Verdict

GATES = (
    Gate(1, "environment", "B1, B2, L2", environment_gate),
    Gate(2, "data", "D1-D3, D6, D8, S6", data_gate),
    Gate(3, "inspect", "D3, D4, D5", inspect_gate, ("data",)),
    Gate(4, "load", "P1, P2, S4", load_gate, ("data",)),
    Gate(5, "update audit", "P3", update_audit_gate, ("load",)),
    Gate(6, "first step", "S1, S4, D9", first_step_gate, ("load",)),
    Gate(7, "steady step", "S4, S5", steady_step_gate, ("first step",)),
    Gate(8, "accumulation", "S2", accumulation_gate, ("load",)),
    Gate(9, "overfit", "D7", overfit_gate, ("load",)),
    Gate(10, "evaluation", "S4, D9, V2", evaluation_gate, ("load",)),
    Gate(11, "checkpoint", "R1, R4, S4", checkpoint_gate, ("first step",)),
    Gate(12, "resume", "R1", resume_gate, ("load",)),
    Gate(13, "export", "R2, P4", export_gate, ("load",)),
)
REPLICAS = Gate(14, "replicas", "S4, S5, B3, B4", replicas_gate, ("load",))
"""A DDP or FSDP campaign's step gates again, in N real processes (replicas.py)."""


def gates_for(campaign: Any) -> tuple[Gate, ...]:
    """The 13 gates, and the replicas gate when the campaign trains with data replicas."""
    return GATES + ((REPLICAS,) if replicated(campaign) else ())
_HEAVY = ("checkpoint", "export", "resume/parent/checkpoints", "resume/child/checkpoints")


@dataclass
class PilotResult:
    pilot_id: str
    folder: Path
    rows: list[GateRow]
    payload: dict[str, Any]
    sizing: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any(r.verdict == Verdict.FAIL for r in self.rows)


def new_pilot_folder(pilots_dir: Path) -> tuple[str, Path]:
    """`p-YYYYMMDD-HHMMSS-xxxx`, created exclusively: an id is never reused."""
    pilots_dir.mkdir(parents=True, exist_ok=True)
    while True:
        pilot_id = f"p-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
        try:
            (pilots_dir / pilot_id).mkdir()
        except FileExistsError:
            continue
        return pilot_id, pilots_dir / pilot_id


def measured_config_hash(ws: Workspace) -> str:
    """What the pilot's measurements depend on: model, data and training, not the variants,
    seeds or rental settings (those only change the plan built from them)."""
    c = ws.campaign
    return stable_hash([c.model.model_dump(mode="json"), c.data.model_dump(mode="json"),
                        c.training.model_dump(mode="json")])  # fmt: skip


def new_state(
    ws: Workspace, pilot_id: str, folder: Path, *, tensors: bool, hooks: PilotHooks | None
) -> PilotState:
    """The control configuration with the campaign's first seed, on this machine's device
    (the first GPU when there is one, else the CPU)."""
    import torch

    from tunepilot.campaign.variants import CONTROL
    from tunepilot.experiments.runner import run_campaign_for

    seed = ws.campaign.seeds[0] if ws.campaign.seeds else ws.campaign.training.seed
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    probe = MemoryProbe.for_device(device, tensors=tensors)
    campaign = run_campaign_for(ws, CONTROL, seed)
    return PilotState(ws, pilot_id, folder, campaign, seed, device, probe, hooks or PilotHooks())


class PilotOptions(TypedDict, total=False):
    """How a pilot runs: profiler tensor bytes, the card and catalog it plans for, test hooks."""

    tensors: bool
    gpu: str | None
    hooks: PilotHooks | None
    catalog: Path | None


def execute_pilot(ws: Workspace, **options: Unpack[PilotOptions]) -> PilotResult:
    """Run every gate in order and write the pilot folder; the caller prints. Unset options:
    no profiler tensor bytes, the campaign's card, the shipped catalog, no test hooks."""
    from tunepilot.sizing.catalog import load_catalog

    tensors, hooks = options.get("tensors", False), options.get("hooks")
    gpu, catalog = options.get("gpu"), options.get("catalog")
    target = gpu or ws.campaign.rental.gpu
    if target:  # a wrong card name is bad input: say so before minutes of gates, not after
        load_catalog(catalog).card(target)
    pilot_id, folder = new_pilot_folder(ws.pilots_dir)
    state = new_state(ws, pilot_id, folder, tensors=tensors, hooks=hooks)
    rows: dict[str, GateRow] = {}
    gates = gates_for(ws.campaign)
    with Progress(f"pilot {pilot_id}", len(gates), "gates", heartbeat=True) as shown:
        for number, gate in enumerate(gates):
            shown.advance(number, f"gate {gate.number} {gate.name}")
            rows[gate.name] = run_gate(state, gate, rows)
        shown.note = ""
        shown.advance(len(gates))
    verdicts = {r.verdict for r in rows.values()}
    overall = next((v for v in (Verdict.FAIL, Verdict.WARN) if v in verdicts), Verdict.PASS)
    payload = {
        "pilot_id": pilot_id,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "campaign": ws.campaign.name,
        "campaign_file": str(ws.campaign_file),
        "config_hash": ws.campaign.config_hash(),
        "measured_config_hash": measured_config_hash(ws),
        "data_version": getattr(state.prepared, "version", None),
        "device": str(state.device),
        "env": state.env,
        "verdict": str(overall),
        "measurements": state.measurements,
        "rows": [r.to_json() for r in rows.values()],
    }
    write_json(folder / "gates.json", payload)
    sizing = write_sizing(state, payload, gpu=target, catalog=catalog)
    for name in _HEAVY:
        shutil.rmtree(folder / name, ignore_errors=True)
    return PilotResult(pilot_id, folder, list(rows.values()), payload, sizing)


def run_pilot(ws: Workspace, *, as_json: bool, **options: Unpack[PilotOptions]) -> int:
    """`tunepilot pilot`: 1 when a gate FAILed, else 0 (WARN passes, with its sentence)."""
    from tunepilot.console import console, print_json

    result = execute_pilot(ws, **options)
    if as_json:
        print_json(result.payload | {"sizing": result.sizing})
    else:
        console.print(gate_table(result.rows, f"pilot {result.pilot_id}: {ws.campaign.name}"))
        per_rank = rank_rows(result.rows)
        if per_rank:
            console.print(gate_table(per_rank, "every rank, every phase (gate 14, S5)"))
        rel = result.folder.relative_to(ws.root)
        console.print(f"saved {rel}/gates.json, samples.txt, sizing.json, plan.md")
        console.print(result.sizing.get("sentence", ""), markup=False)
    return 1 if result.failed else 0


def rank_rows(rows: list[GateRow]) -> list[GateRow]:
    """The replicas gate's rows, one per rank per phase, as gate rows named `phase (rank K)`."""
    gate = next((r for r in rows if r.phase == "replicas"), None)
    keep = ("number", "phase", "inputs", "memory", "duration_s", "verdict", "sentence",
            "requirement")  # fmt: skip
    return [GateRow(**{k: r[k] for k in keep} | {"phase": f"{r['phase']} (rank {r['rank']})"})
            for r in (gate.details.get("rows") or [] if gate else [])]  # fmt: skip


def write_json(path: Path, payload: Any) -> None:
    """Whole or not at all (a full disk is a sentence naming the file); JSON holds no NaN."""
    write_json_atomic(path, json_safe(payload))


# ---------------------------------------------------------------------------------------------
# sizing.json and plan.md (S1, S5, S7, L1, L2, L3)
# ---------------------------------------------------------------------------------------------


def memory_grid(state: PilotState) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """A few (microbatch, length) points around the configured shape, and the held-out one:
    the configured shape itself (microbatch 2 at max_length when the microbatch is 1)."""
    length = state.campaign.data.max_length
    config = getattr(state.model, "config", None)
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and limit > 0:
        length = min(length, limit)
    mb = max(2, state.training.microbatch)
    if state.campaign.hypothesis.task == "image_classification":  # the processor fixes the size
        side = getattr(config, "image_size", 0) // max(1, getattr(config, "patch_size", 1))
        length = side * side + 1  # patches + [CLS]: the sequence every image becomes
        return [(m, length) for m in sorted({1, 2, 4, mb})], (mb, length)
    sizes = sorted({max(8, length // 4), max(8, length // 2), length})
    return [(m, n) for m in (1, mb) for n in sizes], (mb, length)


def _grid_step(state: PilotState) -> Any:
    """One real update (lr 0: Adam's state moves, the weights do not) on `microbatch` copies of
    the longest training example tiled to `length` tokens; only the shape matters here."""
    from tunepilot.pilot.update import make_optimizer, train_update
    from tunepilot.tasks.base import Encoded

    longest = max(state.encoded.train, key=lambda e: len(e.input_ids))
    optimizer = state.optimizer or make_optimizer(state.model, state.training)

    def step(microbatch: int, length: int) -> None:
        if longest.pixel_values is not None:  # an image: its size is the processor's
            return train_update(state, [[longest] * microbatch], optimizer, 0.0)
        ids = (longest.input_ids * (length // len(longest.input_ids) + 1))[:length]
        labels = longest.labels if state.kind == "classification" else ids
        example = Encoded(longest.example_id, ids, labels, 0, False, False, length)
        train_update(state, [[example] * microbatch], optimizer, 0.0)

    return step


def write_sizing(
    state: PilotState, payload: dict[str, Any], *, gpu: str | None, catalog: Path | None
) -> dict[str, Any]:
    """What this machine measured (updates arithmetic, memory grid and its held-out check);
    writes sizing.json and plan.md into the pilot folder and returns what sizing.json holds.
    `tunepilot plan` adds the per-card sheet and the package to both (pilot/plan.py)."""
    from tunepilot.sizing.sheet import updates_sheet

    t, c = state.training, state.campaign
    replicas = t.distributed.nproc if t.distributed.strategy != "none" else 1
    out: dict[str, Any] = {"pilot_id": state.pilot_id}
    lines = [f"# Sizing and rental plan for {c.name} (pilot {state.pilot_id})", ""]
    if state.encoded is not None:
        out["updates"] = updates_sheet(len(state.encoded.train), t.microbatch, t.accumulation,
                                       replicas, updates=t.budget.updates, epochs=t.budget.epochs,
                                       drop_last=t.drop_last)  # fmt: skip
        keys = ("examples_per_update", "updates_per_epoch", "total_updates", "examples_seen")
        shown = ", ".join(f"{k.replace('_', ' ')} {out['updates'][k]}" for k in keys)
        held = f"held fixed: {out['updates']['held']}; follows: {out['updates']['follows']}"
        lines += ["## Updates (S7)", "", out["updates"]["rule"], "", f"Here: {shown}; {held}.", ""]
    if state.model is None or state.encoded is None or state.report is None:
        out["memory"] = "memory not sized here: the model did not load in the pilot (load gate)"
    else:
        lines += _memory_section(state, out)
    asked = (f' --gpu "{gpu}"' if gpu else "") + (f" --catalog {catalog}" if catalog else "")
    out["sentence"] = (
        f"{out.get('memory', 'memory measured on this machine')}; the per-card sheet and the "
        "3/7/30-day package: "
        f"`tunepilot plan {state.ws.campaign_file}{asked}` (dry runs of this configuration, "
        "hours from FLOPs, or from this pilot on the card it ran on)"
    )
    lines += [f"**Next:** {out['sentence']}.", ""]
    write_json(state.folder / "sizing.json", out)
    (state.folder / "plan.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return json_safe(out)


def _memory_section(state: PilotState, out: dict[str, Any]) -> list[str]:
    """Memory grid -> fitted model -> its held-out check, judged on the activation part (S1,
    S5). What this machine's counter saw; the per-card numbers come from the dry run."""
    from tunepilot.measure.memory import is_out_of_memory
    from tunepilot.pilot.memory_fit import (
        fit_memory_model,
        holdout_error,
        measure_memory_grid,
    )

    grid, holdout = memory_grid(state)
    try:
        points = measure_memory_grid(_grid_step(state), grid, state.probe)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        out["memory"] = f"memory not sized here: the grid ran out of memory ({str(exc)[:200]})"
        return [f"**{out['memory']}**", ""]
    fitted, check = fit_memory_model(points), holdout_error(points, holdout=holdout)
    out.update(memory_grid=points, memory_model=fitted.to_json(), holdout=check.to_json())
    verdict = out["holdout"]["verdict"]
    return ["## Memory measured on this machine (S1, S5)", "", fitted.sentence(), "",
            f"Held-out check: {check.sentence}." if check.verdict is None
            else f"Held-out check: {verdict}: {check.sentence}.", ""]  # fmt: skip
