"""`tunepilot plan`: the per-card sheet (L1) and the 3/7/30-day package (L3), before renting.

The plan needs no GPU and no pilot. Its memory numbers are the dry run's (the campaign's exact
step on fake tensors, `sizing.dry_run`); its hours are the dry run's FLOPs over each card's
public peak and the utilisation calibrated on published measurements, except on a card where
a pilot measured the steady step on a quiet machine (B1, L2). A pilot that ran on a CPU adds
no hours for any GPU.

A card whose row does not PASS (`sizing.fit`, the one verdict) gets no hours, no package and
no cost. `plan --gpu X` on such a card exits 1 and names the nearest change that makes it fit,
each candidate a dry run actually executed (`sizing.nearest`), and any machine of the same
card with more GPUs whose row passes.

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
    knobs; the precision and the eval batch are campaign overrides (the step is built exactly
    as a run builds it)."""
    from tunepilot.sizing.dry_run.run import dry_run

    t = ws.campaign.training

    def run(setting: Setting) -> Any:
        extra = [f"training.precision={setting.precision}"] * (setting.precision != t.precision)
        if setting.eval_batch not in (None, t.eval_batch_size):
            extra.append(f"training.eval_batch_size={setting.eval_batch}")
        target = ws.with_overrides(extra) if extra else ws
        return dry_run(target, microbatch=setting.microbatch,
                       activation_checkpointing=setting.checkpointing,
                       base_dtype=setting.base_dtype)  # fmt: skip

    return run


def override_runner(ws: Workspace, card: Any) -> Callable[[list[str]], Any]:
    """The campaign's dry run with dotted overrides on top, at settings `card` can run (an
    unset base dtype loads as it would there): what the nearest-change search executes."""
    from tunepilot.sizing.dry_run.run import dry_run
    from tunepilot.sizing.fit import resolved_base

    def run(overrides: list[str]) -> Any:
        target = ws.with_overrides(overrides)
        base = None if target.campaign.model.base_dtype else resolved_base(card, None)
        return dry_run(target, base_dtype=base)

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
    changes: Callable[[Any], Callable[[list[str]], Any]] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """(sizing.json content, plan.md lines without its title): the per-card sheet, the
    recommendation and the target card's rental plan, or, when the target does not PASS, the
    nearest change that makes it fit (`out["fits"]` False). `splits` are the examples per
    split when the caller has them; `runner` replaces the dry run of a `Setting`, `changes`
    (card -> overrides -> dry run) the one the nearest-change search executes."""
    from tunepilot.pilot.stale import measured_card
    from tunepilot.progress import start_line
    from tunepilot.sizing.catalog import load_catalog
    from tunepilot.sizing.eval_fit import fitting_eval_batch
    from tunepilot.sizing.recommend import recommendation, smallest_fit
    from tunepilot.sizing.rental import plan_markdown
    from tunepilot.sizing.sheet import card_rows, row_plan, sheet_inputs, work_of
    from tunepilot.sizing.sheet_markdown import sheet_markdown
    from tunepilot.sizing.timing import seconds_on

    cards = load_catalog(catalog)
    target = cards.card(gpu) if gpu else None  # a wrong name is exit 2 before any dry run
    c = ws.campaign
    start_line(f"plan: reading the data, then about nine dry runs of {c.model.name_or_path}'s "
               f"step for the {len(cards.cards)} machines of {cards.source}")  # fmt: skip
    if splits is None:
        splits = {k: len(v) for k, v in ws.preview.splits.items()}
    base = getattr(c.model, "base_dtype", None) or DEFAULT_GPU_BASE
    inputs = sheet_inputs(c, splits.get("train", 0), splits.get("validation", 0), base,
                          campaign_file=_shown_path(ws))  # fmt: skip
    if getattr(c.model, "base_dtype", None) is None:
        inputs.assumptions.append(
            f"model.base_dtype unset: each card sized with the base a GPU run loads there, "
            f"{base} where the card has it, fp32 where it does not"
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
    works: dict[int, tuple[Any, Any]] = {}

    def seconds_for(card: Any, dry: Any) -> tuple[Any, str]:
        if id(dry) not in works:
            works[id(dry)] = work_of(dry, inputs)
        flops, io = works[id(dry)]
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
    if plan_card is None:
        out.update(fits=False, sentence="no rental plan: no machine of the catalog fits")
        return out, [*lines, "**No rental plan:** no machine of the catalog fits.", ""]
    made = row_plan(plan_card, runs, inputs, seconds_for)
    if not made["shown"].passes:
        search = (changes or (lambda card: override_runner(ws, card)))(plan_card)
        fits_eval = fitting_eval_batch(plan_card, runs, inputs,
                                       int(made["dry"].cuda_context_bytes))  # fmt: skip
        return _does_not_fit(out, lines, plan_card, made["shown"], sheet, c, search, fits_eval)
    plan = made["plan"]
    if plan is None:
        out.update(fits=True, sentence=f"no rental plan: {made['basis']}")
        return out, [*lines, f"**No rental plan:** {made['basis']}.", ""]
    plan.sentence += lengths_caveat(runs(inputs.setting), c.data.max_length)
    if made["eval_batch"] != inputs.eval_batch:  # chosen for the card (sizing.eval_fit)
        plan.sentence += (f" Evaluation at training.eval_batch_size={made['eval_batch']}, the "
                          f"largest that fits the {plan_card.name} (unset in the campaign): "
                          "every command of the package carries it, so the baseline and "
                          "every variant evaluate alike (V2).")  # fmt: skip
    out["eval_batch"] = made["eval_batch"]
    out.update(fits=True, plan=plan.to_json(), sentence=plan.sentence,
               layout_choice=made["why"] or None)  # fmt: skip
    lines.append(plan_markdown(plan).replace("# Rental plan", "## Rental plan"))
    if made["why"]:
        lines.append(f"Layout: {made['why']}.\n")
    return out, lines


def lengths_caveat(dry: Any, max_length: int) -> str:
    """What the decision line must add about the token lengths behind its hours (4b): an
    upper bound when no tokenizer measured the data, a proxy when another model's did."""
    if dry.phases and dry.phases[0].inputs.get("image"):
        return ""
    if dry.mean_length is None:
        return (f" Caveat: every example was taken at data.max_length={max_length} (no "
                "tokenizer here measured the data): these hours and memory are an upper bound.")
    if "PROXY" in (dry.lengths_source or ""):
        return (f" Token lengths measured with {dry.lengths_source}: hours at the data's mean "
                f"padded length of {dry.mean_length:.0f} tokens per example.")
    return ""


def _shown_path(ws: Workspace) -> str:
    """The campaign file as the package's commands name it: relative to here when inside."""
    try:
        return str(ws.campaign_file.relative_to(Path.cwd()))
    except ValueError:
        return str(ws.campaign_file)


def _does_not_fit(
    out: dict[str, Any], lines: list[str], card: Any, shown: Any, sheet: dict[str, Any],
    campaign: Any, search: Callable[[list[str]], Any], eval_batch: int | None = None,
) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """The target's row does not PASS: no package; the nearest change, tried as dry runs, and
    the machines of the same card with more GPUs whose rows pass."""
    from tunepilot.sizing.nearest import nearest_change

    near = nearest_change(card, shown, campaign, search, eval_batch=eval_batch)
    bigger = [r for r in sheet["rows"] if r["gpus"] > card.gpus
              and r["card"].lower().endswith(card.name.lower())
              and r["configured"]["verdict"] == "PASS"]  # fmt: skip
    others = [f"the {r['card']} ({r['configured']['layout']}): {r['configured']['sentence']}"
              for r in bigger]  # fmt: skip
    head = f"the {card.name} does not fit ({shown.verdict}): {shown.sentence}"
    fixes = [near["sentence"]] if near["fits"] else []
    fixes += [f"rent {o}, with the campaign unchanged" for o in others]
    if not fixes:
        fixes = [near["sentence"]]
    sentence = f"no rental plan: {head}; nearest change: " + "; or ".join(fixes)
    out.update(fits=False, sentence=sentence, nearest_change=near | {"machines": others})
    md = [f"## No rental plan on the {card.name} (L1, L3)", "",
          f"**{shown.verdict}:** {shown.sentence}. No hours, package or cost are given for a "
          "card whose row does not PASS.", "",
          "**Nearest change** (each line a dry run of the campaign, executed):", "",
          "| overrides tried | verdict | deciding phase | what the dry run said |",
          "|---|---|---|---|"]  # fmt: skip
    md += [f"| `{' '.join(t['overrides'])}` | {t['verdict']} | {t['phase']} | {t['sentence']} |"
           for t in near["trials"]]  # fmt: skip
    md += ["", *[f"- {x}" for x in fixes], *[f"- cost of the change: {x}" for x in near["changes"]
                                             if near["fits"]], ""]  # fmt: skip
    return out, [*lines, *md]


def run_plan(ws: Workspace, *, gpu: str | None, as_json: bool, catalog: Path | None = None,
             emit: str | None = None, nodes: int = 1) -> int:
    """`tunepilot plan`: print the sheet and the package; write them into the latest pilot's
    folder when that pilot measured this configuration; with `emit`, the launcher's job file
    for the planned card. Exit 1 when the card planned for does not PASS (the nearest change
    is printed instead of a package)."""
    from tunepilot.console import console, print_json
    from tunepilot.errors import input_error
    from tunepilot.pilot.flow import write_json

    if emit not in (None, "skypilot"):
        raise input_error("--emit", f"`{emit}`", "use --emit skypilot")
    folder, pilot, note = matching_pilot(ws)
    out, lines = build_plan(ws, gpu=gpu or ws.campaign.rental.gpu, catalog=catalog, pilot=pilot)
    out["pilot_note"] = note
    if emit:
        from tunepilot.sizing.launch import emit_skypilot

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
    return 0 if out.get("fits", True) else 1
