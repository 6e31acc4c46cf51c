"""A rented machine as the engine runs it (B3, B4, S7, L3): which layout, how fast, which
commands.

A machine of N GPUs can run the campaign three ways (`sizing.fit.Layout`), each only where
its per-GPU bytes fit (the one verdict, `sizing.fit.fit`):

- **side by side**: N independent runs at once, one per GPU (`tunepilot run --jobs N`); each
  run goes at one GPU's speed, the experiment's runs go in waves of N;
- **DDP / FSDP over N**: one run at a time over all N (`tunepilot run --nproc N --strategy`);
  an update takes the single-GPU time / (N x the scaling efficiency, labelled); the
  accumulation per GPU is divided by N so the examples per update stay what the campaign
  says (S7: data replicas multiply them), and where N does not divide it the plan says how
  many examples an update then holds. Evaluation runs on every rank at one GPU's speed.

The plan builds the package of every layout that fits and keeps the one with the fewest hours,
saying which and why; a single GPU has one layout.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from tunepilot.sizing.fit import DDP, FSDP, SIDE_BY_SIDE, Fit, Layout
from tunepilot.sizing.timing import PhaseSeconds


def layout_seconds(
    seconds: PhaseSeconds, layout: Layout, accumulation: int
) -> tuple[PhaseSeconds, int, str]:
    """(seconds per unit of work under `layout`, runs side by side, what it means for the
    batch). DDP/FSDP divide the accumulation by N (rounded up) to hold examples per update."""
    from tunepilot.sizing.throughput import scaling_efficiency, scaling_sentence

    if layout.kind not in (DDP, FSDP):
        side = layout.gpus if layout.kind == SIDE_BY_SIDE else 1
        return seconds, side, ""
    n = layout.gpus
    per_gpu = math.ceil(accumulation / n)
    e = scaling_efficiency(n)
    update = seconds.update * per_gpu / accumulation / e
    eval_pass = seconds.eval_pass / (e if layout.kind == FSDP else 1.0)
    scaled = replace(seconds, update=update, eval_pass=eval_pass,
                     resume=seconds.resume - seconds.update + update,
                     basis=f"{seconds.basis}; {layout.label}: {scaling_sentence(layout.kind, n)}")
    held = (f"training.accumulation={per_gpu} per GPU keeps {accumulation} microbatches per "
            "update (S7)" if per_gpu * n == accumulation
            else f"training.accumulation={per_gpu} per GPU: {per_gpu * n} microbatches per "
            f"update instead of {accumulation}, a different batch (record it, S7)")  # fmt: skip
    return scaled, 1, held  # fmt: skip


def commands(campaign: str, card: str, layout: Layout, accumulation: int,
             seed: int, extra: str = "") -> dict[str, tuple[str, ...]]:  # fmt: skip
    """The commands of each package phase on `card` under `layout` (what a launcher runs);
    `extra` holds overrides every command gets (the card's eval batch, `sizing.eval_fit`)."""
    c = (f'"{campaign}"' if " " in campaign else campaign) + extra
    if layout.kind in (DDP, FSDP):
        per_gpu = math.ceil(accumulation / layout.gpus)
        how = f" --nproc {layout.gpus} --strategy {layout.kind} training.accumulation={per_gpu}"
    else:
        how = f" --jobs {layout.gpus}" if layout.kind == SIDE_BY_SIDE else ""
    single = how if layout.kind in (DDP, FSDP) else ""
    return {
        "re-pilot on this card": (f'tunepilot pilot {c} --gpu "{card}"',
                                  f'tunepilot plan {c} --gpu "{card}"'),
        "initial control": (f"tunepilot baseline {c}",
                            f"tunepilot run {c} --variant control --seeds {seed}{single}"),
        "experiment": (f"tunepilot run {c}{how}",),
        "evaluation": (f"tunepilot compare {c}", f"tunepilot test --final <chosen run> {c}"),
        "resume rehearsal": (f"tunepilot resume <control run> {c}",),
        "export": (f"tunepilot export <chosen run> {c}", "tunepilot verify exports/<chosen run>"),
    }  # fmt: skip


def stack_note(card: Any, base_dtype: str, attention: str | None) -> str:
    """What the re-pilot's environment gate must find on `card` (B1, B2): the backend, the
    architecture the torch build must target, the oldest release that supports it, and the
    builds of the extensions the campaign uses."""
    rocm = card.backend == "rocm"
    parts = [f"{'ROCm' if rocm else 'CUDA'} on {card.arch or 'an architecture not in the catalog'}"
             + (f", {card.stack}" if card.stack else "")]  # fmt: skip
    if base_dtype in ("nf4", "int8"):
        parts.append(f"bitsandbytes built for {'ROCm (its HIP build)' if rocm else 'CUDA'}")
    if attention and attention.startswith("flash"):
        parts.append("flash-attn built for ROCm (its composable-kernel build)" if rocm
                     else "flash-attn for this CUDA and torch")  # fmt: skip
    return "; ".join(parts)


def plan_machine(
    card: Any, fits: list[Fit], seconds: PhaseSeconds | None, inputs: Any,
    prices: dict[int, float | None], extra: str = "",
) -> tuple[Fit, Any | None, str]:  # fmt: skip
    """(the layout's fit, its RentalPlan or None, why this layout): every passing layout
    planned, the fewest hours kept; None when nothing passes or the card has no hours."""
    from tunepilot.sizing.rental import plan_rental, repilot_seconds

    passing = [f for f in fits if f.passes]
    if not passing or seconds is None:
        from tunepilot.sizing.fit import best_fit

        return best_fit(fits), None, ""
    options = []
    for f in passing:
        secs, side, held = layout_seconds(seconds, f.layout, inputs.accumulation)
        plan = plan_rental(
            secs, inputs.updates_per_run, inputs.n_variants, inputs.n_seeds,
            inputs.evals_per_run, gpus_in_package=side, margin=inputs.margin, prices=prices,
            checkpoints_per_run=inputs.checkpoints_per_run, packages=inputs.packages,
            repilot_seconds=repilot_seconds(seconds, inputs.examples_per_update,
                                            inputs.eval_batches),
            commands=commands(inputs.campaign_file, card.name, f.layout, inputs.accumulation,
                              inputs.first_seed, extra),
            layout=f.layout.label + (f"; {held}" if held else ""),
            stack=stack_note(card, inputs.on(card).base_dtype, inputs.attention),
        )  # fmt: skip
        options.append((plan.total_hours, f, plan))
    hours, chosen, plan = min(options, key=lambda o: o[0])
    if len(fits) == 1:
        return chosen, plan, ""
    said = "; ".join(f"{f.layout.label} {h:.1f} h" for h, f, _ in options)
    failed = [f"{f.layout.label} does not fit ({f.sentence})" for f in fits if not f.passes]
    why = (f"{chosen.layout.label}, the fastest layout that fits: {said}"
           + (f"; {'; '.join(failed)}" if failed else ""))  # fmt: skip
    return chosen, plan, why
