"""The per-card sheet as a person reads it: the dry run's phases, one row per card, S3's two
options sized apart, and every assumption by name. One renderer for `tunepilot plan` (its
first section), `tunepilot size` and the pilot's plan.md."""

from __future__ import annotations

from typing import Any

from tunepilot.measure.memory import human_bytes

SPLIT = ("weights", "gradients", "optimizer", "activations", "temporaries", "peak")


def _gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.1f} GiB"


def phases_table(phases: list[dict[str, Any]]) -> list[str]:
    """One row per phase of the dry run: the peak split and the FLOPs counted (S5)."""
    lines = [
        "| phase | " + " | ".join(SPLIT) + " | FLOPs | inputs |",
        "|---|" + "---:|" * (len(SPLIT) + 1) + "---|",
    ]
    for p in phases:
        inputs = ", ".join(f"{k} {v}" for k, v in (p.get("inputs") or {}).items())
        cells = " | ".join(human_bytes(p.get(k)) for k in SPLIT)
        lines.append(f"| {p['phase']} | {cells} | {float(p.get('flops') or 0):.3g} | {inputs} |")
    notes = [f"{p['phase']}: {n}" for p in phases for n in p.get("notes") or []]
    return lines + ([""] + [f"- {n}" for n in dict.fromkeys(notes)] if notes else [])


def _row(r: dict[str, Any]) -> str:
    fit = r["configured"]
    big = r["largest_microbatch"]
    if big.get("sized", True):
        shown = ["any" if v is None else str(v) for v in (big["without checkpointing"],
                                                          big["with checkpointing"])]  # fmt: skip
        if big.get("blocked_by"):
            shown[-1] += f" ({big['blocked_by']} alone does not fit)"
        largest = " / ".join(shown)
    else:
        largest = f"n/a (sized with a {r['base_dtype']} base)"
    layout = fit.get("layout") or "one GPU"
    if r.get("layouts"):
        layout += " (" + ", ".join(f"{x['layout_kind']} {x['verdict']} {_gib(x['peak_bytes'])}"
                                   for x in r["layouts"]) + ")"  # fmt: skip
    pkg = r.get("package")
    if pkg is None:
        hours, package = "n/a", r["basis"].removeprefix("no hours: ")
    else:
        low, high = pkg.get("hours_range") or (pkg["hours"], pkg["hours"])
        spread = "" if pkg["measured"] else f", {low:.1f}-{high:.1f}"
        hours = f"{pkg['hours']:.1f} ({'measured' if pkg['measured'] else 'computed'}{spread})"
        package = f"{pkg['days']} days, {pkg['cost']}" if pkg["days"] else "none fits"
    return (
        f"| {r['card']} | {fit['verdict']} {_gib(fit['peak_bytes'])} of "
        f"{_gib(r['memory_bytes'])} | {fit['headroom']:.0%} | {fit.get('phase', '')} | "
        f"{largest} | {', '.join(r['base_dtypes_that_fit']) or 'none'} | {layout} | {hours} | "
        f"{package} |"
    )


def sheet_markdown(sheet: dict[str, Any], recommendation: str) -> str:
    """The sheet's markdown section (L1); `recommendation` is the L2 sentence."""
    c = sheet["configured"]
    first, second = sheet["blocks_measured"]
    ckpt = "on" if c["checkpointing"] else "off"
    each = c.get("input") or f"length {c['max_length']}"  # an image's size, else tokens
    lines = [
        f"## Per-card sheet (L1, S1, S3): dry run of {sheet['model']}",
        "",
        f"{sheet['architecture']}, {sheet['layers']} layers: models of {first} and {second} "
        f"blocks were run on fake tensors and the other blocks extrapolated exactly (they "
        f"repeat); no weights read, no GPU used; {sheet['dry_runs']} dry runs.",
        "",
        f"Configured step: microbatch {c['microbatch']} x {each} "
        f"(accumulation {c['accumulation']}), base dtype {c['base_dtype']}, training.precision "
        f"{c['precision']}, activation checkpointing {ckpt}.",
        "",
        "Each row splits the phase's peak at its peak moment: gradients appear as far as "
        "backward has made them by then, optimizer state once the first step has allocated it.",
        "",
        *phases_table(sheet["phases"]),
        *[f"- {n}" for n in sheet.get("notes", [])[1:]],
        "",
        f"**Recommendation (L2):** {recommendation}.",
        "",
        "Each row is the one verdict (every phase per GPU with the device context, "
        "every precision the step computes in, the headroom kept free); only a PASS row has "
        "hours and a package. A machine of several GPUs shows each layout it can run and "
        "plans the fastest that fits.",
        "",
        f"| card | verdict, per GPU | headroom | deciding phase | largest microbatch at {each} "
        "(without / with checkpointing) | base dtypes that fit with headroom | layout | hours "
        "(expected, range) | package |",
        "|---|---|---:|---|---|---|---|---:|---|",
        *(_row(r) for r in sheet["rows"]),
        "",
        f"Ranking: {sheet.get('ranking', '')}.",
        "",
        "Each option sized on the phase it changes (S3, S4):",
        "",
        f"- {sheet['checkpointing']['sentence']}.",
        f"- {sheet['eval_batch']['sentence']}.",
        f"- {sheet['precision']['sentence']}.",
        "- base dtype, peak at the configured step: "
        + ", ".join(
            f"{d} {human_bytes(b) if b is not None else 'not sized'}"
            for d, b in sheet["base_dtypes"].items()
        )
        + " (dry runs; nf4/int8 need bitsandbytes on CUDA, B1).",
    ]
    lines += ["", f"Hours: {sheet['hours_basis']}."]
    measured = [r["basis"] for r in sheet["rows"] if (r.get("package") or {}).get("measured")]
    lines += [f"Except: {b}." for b in measured]
    lines += ["", "Assumptions: " + "; ".join(sheet["assumptions"]) + ".", ""]
    return "\n".join(lines)
