"""`tunepilot pilot` and `tunepilot plan`: the command bodies (S1, S4-S7, D7, D9, B1, L1-L3).

`run_pilot` runs the 13 gates in order on the campaign's control configuration, each inside
the one memory probe, and writes `pilots/<pilot-id>/`:

    gates.json     one row per phase + backend fingerprint + config hash + data version
    samples.json   the rendered inspect samples (and samples.txt for a person)
    sizing.json    memory grid, fitted memory model, selection sheet, updates arithmetic
    plan.md        the rental plan and the recommendation (or why there is none)

The pilot keeps its measurements, not its weights: the checkpoint, resume and export folders
it wrote are deleted once measured (their manifests and metrics stay in gates.json).

`run_plan` re-reads the latest pilot's measurements (step, evaluation, checkpoint, resume and
export times) and measures a fresh memory grid, so the plan can be redone for another card
(`--gpu`) or catalog (`--catalog`) without rerunning every gate.
"""

from __future__ import annotations

import json
import math
import secrets
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tunepilot.campaign import stable_hash
from tunepilot.data.workspace import Workspace
from tunepilot.errors import input_error
from tunepilot.measure.memory import MemoryProbe
from tunepilot.pilot.child import export_gate, overfit_gate, resume_gate
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
from tunepilot.pilot.phases import Gate, GateRow, PilotHooks, PilotState, gate_table, run_gate
from tunepilot.pilot.stale import environment_gate, measured_card
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
STACK_GATES = ("environment", "first step", "steady step")  # L2: what "the stack passed" means
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


def execute_pilot(
    ws: Workspace,
    *,
    tensors: bool = False,
    gpu: str | None = None,
    hooks: PilotHooks | None = None,
    catalog: Path | None = None,
) -> PilotResult:
    """Run every gate in order and write the pilot folder; the caller prints."""
    from tunepilot.sizing.catalog import load_catalog

    target = gpu or ws.campaign.rental.gpu
    if target:  # a wrong card name is bad input: say so before minutes of gates, not after
        load_catalog(catalog).card(target)
    pilot_id, folder = new_pilot_folder(ws.pilots_dir)
    state = new_state(ws, pilot_id, folder, tensors=tensors, hooks=hooks)
    rows: dict[str, GateRow] = {}
    for gate in GATES:
        rows[gate.name] = run_gate(state, gate, rows)
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


def run_pilot(
    ws: Workspace,
    *,
    as_json: bool,
    tensors: bool = False,
    gpu: str | None = None,
    hooks: PilotHooks | None = None,
    catalog: Path | None = None,
) -> int:
    """`tunepilot pilot`: 1 when a gate FAILed, else 0 (WARN passes, with its sentence)."""
    from tunepilot.console import console, print_json

    result = execute_pilot(ws, tensors=tensors, gpu=gpu, hooks=hooks, catalog=catalog)
    if as_json:
        print_json(_json_safe(result.payload | {"sizing": result.sizing}))
    else:
        console.print(gate_table(result.rows, f"pilot {result.pilot_id}: {ws.campaign.name}"))
        rel = result.folder.relative_to(ws.root)
        console.print(f"saved {rel}/gates.json, samples.txt, sizing.json, plan.md")
        console.print(result.sizing.get("sentence", ""), markup=False)
    return 1 if result.failed else 0


def _json_safe(value: Any) -> Any:
    """JSON has no NaN or Infinity: such floats become their text; paths become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def write_json(path: Path, payload: Any) -> None:
    """Atomic: a reader never sees half a file."""
    text = json.dumps(_json_safe(payload), indent=2, ensure_ascii=False, default=str)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------
# tunepilot plan
# ---------------------------------------------------------------------------------------------


def latest_pilot(ws: Workspace) -> Path:
    """The newest pilot folder with a gates.json, or an InputError saying to run the pilot."""
    found = sorted(p for p in ws.pilots_dir.glob("p-*") if (p / "gates.json").is_file())
    if not found:
        fix = f"run `tunepilot pilot {ws.campaign_file}` first"
        raise input_error(str(ws.pilots_dir), "no pilot has run for this campaign", fix, "no pilot")
    return found[-1]


def run_plan(ws: Workspace, *, gpu: str | None, as_json: bool, catalog: Path | None = None) -> int:
    """`tunepilot plan`: the selection sheet (L1) and rental plan (L3) from the latest pilot's
    measurements and a freshly measured memory grid; rewrites its sizing.json and plan.md."""
    from tunepilot.console import console, print_json
    from tunepilot.experiments.runner import Session
    from tunepilot.model.params import trainable_report

    folder = latest_pilot(ws)
    payload = json.loads((folder / "gates.json").read_text(encoding="utf-8"))
    if payload.get("measured_config_hash") != measured_config_hash(ws):
        raise input_error(str(ws.campaign_file),
                          f"the model, data or training settings changed since pilot "
                          f"{folder.name}: its measurements do not hold for this configuration",
                          f"rerun `tunepilot pilot {ws.campaign_file}`", "stale pilot")  # fmt: skip
    state = new_state(ws, folder.name, folder, tensors=False, hooks=None)
    state.session = Session(ws)
    state.encoded = state.session.encoded(state.campaign)
    state.prepared = state.encoded.prepared
    state.model = state.session.build_model(state.campaign, state.seed).to(state.device)
    state.report = trainable_report(state.model)
    sizing = write_sizing(state, payload, gpu=gpu or ws.campaign.rental.gpu, catalog=catalog)
    if as_json:
        print_json(sizing)
    else:
        console.print((folder / "plan.md").read_text(encoding="utf-8"), markup=False)
    return 0


# ---------------------------------------------------------------------------------------------
# sizing.json and plan.md (L1, L2, L3, S7)
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
    from tunepilot.pilot.gates import make_optimizer, train_update
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
    """Measure the memory grid, build the selection sheet and the rental plan, write
    sizing.json and plan.md into the pilot folder; returns what sizing.json holds."""
    from tunepilot.sizing.catalog import load_catalog
    from tunepilot.sizing.sheet import updates_sheet

    cards = load_catalog(catalog)
    t, c = state.training, state.campaign
    card = cards.card(gpu) if gpu else None
    env = payload.get("env") or {}
    replicas = t.distributed.nproc if t.distributed.strategy != "none" else 1
    out: dict[str, Any] = {
        "pilot_id": state.pilot_id, "measured_on": measured_card(env, cards),
        "target": card.name if card else None, "backend": (env.get("torch") or {}).get("backend"),
    }  # fmt: skip
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
        out["sentence"] = "not sized: the model did not load in the pilot (see the load gate)"
    else:
        lines += _memory_section(state, payload, out, cards, card, replicas)
    lines += _plan_section(state, payload, out, cards, card)
    write_json(state.folder / "sizing.json", out)
    (state.folder / "plan.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return _json_safe(out)


def _memory_section(state: PilotState, payload: dict[str, Any], out: dict[str, Any],
                    cards: Any, card: Any, replicas: int) -> list[str]:  # fmt: skip
    """Memory grid -> fitted model with its held-out error -> selection sheet (S1, L1, L2)."""
    from tunepilot.measure.memory import is_out_of_memory
    from tunepilot.sizing.sheet import (
        fit_memory_model,
        holdout_error,
        measure_memory_grid,
        selection_sheet,
    )

    t, c = state.training, state.campaign
    grid, holdout = memory_grid(state)
    try:
        points = measure_memory_grid(_grid_step(state), grid, state.probe)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        out["sentence"] = f"not sized: the memory grid ran out of memory ({str(exc)[:200]})"
        return [f"**Not sized:** {out['sentence']}", ""]
    fitted, check = fit_memory_model(points), holdout_error(points, holdout=holdout)
    rows = {r["phase"]: r["verdict"] for r in payload["rows"]}
    stack_ok = all(rows.get(g) in ("PASS", "WARN") for g in STACK_GATES)
    guards = c.hypothesis.classification_guards
    expected = c.hypothesis.behaviour + (
        f" ({guards.metric} per class; no class may drop more than {guards.max_class_drop})"
        if state.kind == "classification" else ""
    )  # fmt: skip
    sheet = selection_sheet(
        n_params_total=state.report.total_params, n_trainable=state.report.trainable_params,
        memory_model=fitted, microbatch=t.microbatch, max_length=holdout[1],
        accumulation=t.accumulation, precision=t.precision, expected_result=expected,
        cards=cards.cards, stack_checked=stack_ok, checked_backend=out["backend"],
        strategy=t.distributed.strategy, world_size=replicas,
        activation_checkpointing=t.activation_checkpointing, measured_precision=t.precision,
        gpu=card.name if card else None, measured_on=out["measured_on"],
    )  # fmt: skip
    out.update(memory_grid=points, memory_model=fitted.to_json(), sheet=sheet,
               holdout={**check.__dict__, "verdict": str(check.verdict)})  # fmt: skip
    head = "| configuration | examples/update | peak per GPU | fit |\n|---|---:|---:|---|"
    lines = ["## Memory (S1, S5)", "", fitted.sentence(), "", f"Held-out check: {check.sentence}.",
             "", sheet["static_bytes"]["sentence"], "", "## Selection sheet (L1, L2)", "",
             f"**{sheet['recommendation_sentence']}**", "", head]  # fmt: skip
    for row in sheet["rows"]:
        fits = {card.name: row["fits"][card.name]} if card else row["fits"]
        said = [f"{n}: {f['verdict']} ({f['sentence'].split(' (per GPU')[0]})"
                for n, f in fits.items() if card or f["verdict"] == "PASS"][:2]  # fmt: skip
        peak = row["peak_bytes_per_gpu"] / 2**30
        lines.append(f"| {row['label']} | {row['examples_per_update']} | {peak:.2f} GiB | "
                     f"{'; '.join(said) or 'fits no card'} |")  # fmt: skip
    return lines + ["", "Assumptions: " + "; ".join(sheet["assumptions"]) + ".", ""]


def _plan_section(state: PilotState, payload: dict[str, Any], out: dict[str, Any], cards: Any,
                  card: Any) -> list[str]:  # fmt: skip
    """Hours per phase and the package (L3), from the pilot's measured times."""
    from tunepilot.sizing.catalog import speed_ratio
    from tunepilot.sizing.rental import plan_markdown, plan_rental

    t, c, m = state.training, state.campaign, payload.get("measurements") or {}
    needed = ("step_seconds", "eval_seconds", "checkpoint_seconds")
    if not all(k in m for k in needed) or "updates" not in out:
        out.setdefault("sentence", "no rental plan: the pilot did not measure the step, "
                       "evaluation and checkpoint times (see the FAILed gates)")  # fmt: skip
        return [f"**No rental plan:** {out['sentence']}"]
    total, measured_on, ratio, note = out["updates"]["total_updates"], out["measured_on"], 1.0, ""
    if card is not None and measured_on in {x.name for x in cards.cards}:
        ratio, _ = speed_ratio(cards, measured_on, card.name)
    elif card is not None:
        note = (f"The step time was measured on {measured_on} and is NOT scaled to {card.name}: "
                "the hours below are this machine's, an upper bound for any GPU; rerun "
                "`tunepilot pilot` on the card for a real plan.")  # fmt: skip
    plan = plan_rental(
        m["step_seconds"], measured_on, ratio, total, len(c.variants), len(c.seeds),
        m["eval_seconds"], math.ceil(total / t.eval_every), m["checkpoint_seconds"],
        m.get("export_seconds", 0.0), m.get("resume_seconds", 0.0),
        gpus_in_package=card.gpus if card else c.rental.gpus, margin=c.rental.margin,
        prices=card.prices if card else None, target=card.name if card else None,
        checkpoints_per_run=math.ceil(total / t.checkpoint_every) if t.checkpoint_every else 1,
        packages=tuple(sorted(c.rental.packages_days)),
    )  # fmt: skip
    out.update(plan=plan.to_json(), sentence=plan.sentence)
    return [note, "", plan_markdown(plan).replace("# Rental plan", "## Rental plan")]
