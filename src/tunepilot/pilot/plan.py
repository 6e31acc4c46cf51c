"""`tunepilot plan`: the per-card sheet (L1) and the 3/7/30-day package (L3), before renting.

The plan needs no GPU and no pilot. Its memory numbers are the dry run's (the campaign's exact
step on fake tensors, `sizing.dry_run`); its hours are the dry run's FLOPs over each card's
public peak and a labelled utilisation, except on a card where a pilot measured the steady
step on a quiet machine (B1, L2). A pilot that ran on a CPU adds no hours for any GPU.

When the latest pilot measured this very configuration, the plan is written into its folder
(sizing.json, plan.md) next to its gates; otherwise it is printed only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunepilot.data.workspace import Workspace
from tunepilot.sizing.sheet import DryRuns, Setting

STACK_GATES = ("environment", "first step", "steady step")  # L2: what "the stack passed" means
DEFAULT_GPU_BASE = "bf16"
"""The base dtype a GPU run loads when `model.base_dtype` is unset (bf16 where the card has
it); the sheet states that it sized this default."""


def dry_runner(ws: Workspace) -> Callable[[Setting], Any]:
    """One dry run per `Setting`, on the campaign as configured except for the setting's
    knobs; the precision is a campaign override (the step is built exactly as a run builds it)."""
    from tunepilot.sizing.dry_run.run import dry_run

    def run(setting: Setting) -> Any:
        target = ws
        if setting.precision != ws.campaign.training.precision:
            override = f"training.precision={setting.precision}"
            target = Workspace.open(ws.campaign_file, [*ws.overrides, override])
        return dry_run(target, microbatch=setting.microbatch,
                       activation_checkpointing=setting.checkpointing,
                       base_dtype=setting.base_dtype)  # fmt: skip

    return run


def matching_pilot(ws: Workspace) -> tuple[Path | None, dict[str, Any] | None, str]:
    """(folder, gates.json, note): the latest pilot when it measured this configuration."""
    from tunepilot.pilot.flow import measured_config_hash

    found = sorted(p for p in ws.pilots_dir.glob("p-*") if (p / "gates.json").is_file())
    if not found:
        return None, None, "no pilot has run: hours are computed, none measured"
    payload = json.loads((found[-1] / "gates.json").read_text(encoding="utf-8"))
    if payload.get("measured_config_hash") != measured_config_hash(ws):
        return (
            None,
            None,
            (
                f"pilot {found[-1].name} measured another model, data or training configuration: "
                "its times are not used"
            ),
        )
    return found[-1], payload, f"pilot {found[-1].name} measured this configuration"


def build_plan(
    ws: Workspace,
    *,
    gpu: str | None,
    catalog: Path | None,
    pilot: dict[str, Any] | None,
    splits: dict[str, int] | None = None,
    runner: Callable[[Setting], Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """(sizing.json content, plan.md lines without its title): the per-card sheet, the
    recommendation and the target card's rental plan. `splits` are the examples per split when
    the caller has them; `runner` replaces the dry run."""
    from tunepilot.pilot.stale import measured_card
    from tunepilot.sizing.catalog import load_catalog
    from tunepilot.sizing.recommend import recommendation, smallest_fit
    from tunepilot.sizing.rental import plan_markdown, plan_rental
    from tunepilot.sizing.sheet import card_rows, sheet_inputs, work_of
    from tunepilot.sizing.sheet_markdown import sheet_markdown
    from tunepilot.sizing.timing import seconds_on

    cards = load_catalog(catalog)
    target = cards.card(gpu) if gpu else None  # a wrong name is exit 2 before any dry run
    c = ws.campaign
    if splits is None:
        splits = {k: len(v) for k, v in ws.prepare(write=False, seal=False).splits.items()}
    base = getattr(c.model, "base_dtype", None) or DEFAULT_GPU_BASE
    inputs = sheet_inputs(c, splits.get("train", 0), splits.get("validation", 0), base)
    if getattr(c.model, "base_dtype", None) is None:
        inputs.assumptions.append(
            f"model.base_dtype unset: sized as {base}, what a GPU run loads where the card has it"
        )
    env = (pilot or {}).get("env") or {}
    measured_on = measured_card(env, cards) if pilot else None
    measurements = (pilot or {}).get("measurements") or {}
    pilot_id = (pilot or {}).get("pilot_id", "")
    if pilot and measured_on not in {card.name for card in cards.cards}:
        inputs.assumptions.append(
            f"pilot {pilot_id} timed its step on {measured_on}, no card of the catalog: a "
            "time measured there is never used as a GPU's, every hour is computed (B1, L2)"
        )
    runs = DryRuns(runner or dry_runner(ws))
    flops, io = work_of(runs(inputs.setting), inputs)

    def seconds_for(card: Any) -> tuple[Any, str]:
        return seconds_on(card, cards, flops, io, measured_on=measured_on,
                          measurements=measurements, pilot_id=pilot_id)  # fmt: skip

    sheet = card_rows(runs, inputs, cards, seconds_for=seconds_for)
    rows = {r["phase"]: r["verdict"] for r in (pilot or {}).get("rows") or []}
    stack_ok = bool(rows) and all(rows.get(g) in ("PASS", "WARN") for g in STACK_GATES)
    backend = ((env.get("torch") or {}).get("backend") or "cpu") if stack_ok else None
    chosen, why = recommendation(sheet, {backend} if backend else set())
    out: dict[str, Any] = {
        "pilot_id": pilot_id or None, "measured_on": measured_on, "splits": splits,
        "target": target.name if target else None, "backend": backend, "sheet": sheet,
        "recommendation": chosen["card"] if chosen else None, "recommendation_sentence": why,
    }  # fmt: skip
    lines = [sheet_markdown(sheet, why)]
    smallest = smallest_fit(sheet)
    plan_card = target or (cards.card(smallest["card"]) if smallest else None)
    seconds, basis = seconds_for(plan_card) if plan_card else (None, "no card fits")
    if seconds is None:
        out["sentence"] = f"no rental plan: {basis}"
        return out, [*lines, f"**No rental plan:** {basis}.", ""]
    plan = plan_rental(seconds, inputs.updates_per_run, inputs.n_variants, inputs.n_seeds,
                       inputs.evals_per_run, gpus_in_package=plan_card.gpus, margin=inputs.margin,
                       prices={d: plan_card.package_price(d) for d in inputs.packages},
                       checkpoints_per_run=inputs.checkpoints_per_run,
                       packages=inputs.packages)  # fmt: skip
    out.update(plan=plan.to_json(), sentence=plan.sentence)
    lines.append(plan_markdown(plan).replace("# Rental plan", "## Rental plan"))
    return out, lines


def run_plan(ws: Workspace, *, gpu: str | None, as_json: bool, catalog: Path | None = None,
             emit: str | None = None, nodes: int = 1) -> int:
    """`tunepilot plan`: print the sheet and the package; write them into the latest pilot's
    folder when that pilot measured this configuration; with `emit`, the launcher's job file
    for the planned card."""
    from tunepilot.console import console, print_json
    from tunepilot.errors import input_error
    from tunepilot.pilot.flow import write_json

    if emit not in (None, "skypilot"):
        raise input_error("--emit", f"`{emit}`", "use --emit skypilot")
    folder, pilot, note = matching_pilot(ws)
    out, lines = build_plan(ws, gpu=gpu or ws.campaign.rental.gpu, catalog=catalog, pilot=pilot)
    out["pilot_note"] = note
    if emit:
        out["emitted"] = str(emit_skypilot(ws, out, catalog, nodes))
    head = f"# Sizing and rental plan for {ws.campaign.name}"
    text = "\n".join([head, "", note + ".", "", *lines]) + "\n"
    if folder is not None:  # the pilot's own measurements stay; an earlier plan is replaced
        path = folder / "sizing.json"
        kept = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        write_json(path, kept | out)
        md = folder / "plan.md"
        measured = md.read_text(encoding="utf-8") if md.is_file() else head + "\n"
        measured = measured.split("\n## Per-card sheet")[0].split("\n**Next:**")[0].rstrip()
        md.write_text("\n".join([measured, "", *lines]) + "\n", encoding="utf-8")
    if as_json:
        print_json(out)
    else:
        console.print(text, markup=False, soft_wrap=True)  # markdown tables stay one line
    return 0


def emit_skypilot(ws: Workspace, plan: dict[str, Any], catalog: Path | None, nodes: int) -> Path:
    """Write `<campaign>/launch/skypilot.yaml` for the plan's card: the target, else the
    recommendation (L3). No card that fits is bad input: there is nothing to launch."""
    from tunepilot import __version__
    from tunepilot.console import error_console
    from tunepilot.errors import input_error, write_text_atomic
    from tunepilot.sizing.catalog import load_catalog
    from tunepilot.sizing.launch import package_phases, skypilot_task, source_tree, task_yaml

    name = plan.get("target") or plan.get("recommendation")
    if not name:
        raise input_error("--emit skypilot", "no card of the catalog fits this campaign",
                          "pass --gpu with a card that fits (see the sheet above)")  # fmt: skip
    card = load_catalog(catalog).card(name)
    task = skypilot_task(
        campaign_name=ws.campaign.name, campaign_folder=ws.root.resolve(),
        campaign_file=ws.campaign_file.name, card_name=card.name, gpus=card.gpus, nodes=nodes,
        phases=package_phases(ws.campaign, card.name), version=__version__,
        source=source_tree(),
    )  # fmt: skip
    header = [f"SkyPilot task for the campaign {ws.campaign.name}, written by `tunepilot plan "
              f"--emit skypilot` for {nodes} x {card.name}.",
              f"Launch:  sky jobs launch {ws.root / 'launch' / 'skypilot.yaml'}",
              "A managed job restarts a preempted instance; the phases done are skipped and a",
              "run continues from its newest checkpoint (the campaign folder lives on the",
              "bucket below). Plan: " + str(plan.get("sentence", "")), ""]  # fmt: skip
    path = ws.root / "launch" / "skypilot.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, task_yaml(task, header))
    error_console.print(f"launcher job written: {path} (sky jobs launch {path})",
                        highlight=False, soft_wrap=True)  # fmt: skip
    return path
