"""The per-card selection sheet (L1, S1, S3, S6, B3, B4): what the campaign's exact step needs
on every card of the catalog, from a handful of GPU-free dry runs.

Every memory number here is a dry run's: the campaign's model built from its config on fake
tensors, its step executed phase by phase (`sizing.dry_run`). Nothing is an assumed share:

- activation bytes are linear in the microbatch at a fixed length, so the dry runs at
  microbatch 1 and 2 give each phase's exact slope, and the largest microbatch per card
  follows without calling the dry run again;
- activation checkpointing and precision are each sized by their own dry runs (S3), with
  their memory effect (peak bytes) and time effect (FLOPs per update, and the card's peak for
  the precision);
- the base dtypes (fp32, bf16, nf4) are dry runs at the configured shape.

At most eight dry runs, each once (`DryRuns` keeps them). DDP and FSDP per-GPU bytes for
multi-GPU machines are arithmetic on the dry run's split (weights, gradients, optimizer
state, activations), stated as such.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tunepilot.errors import InputError, input_error
from tunepilot.measure.memory import human_bytes
from tunepilot.sizing.catalog import Catalog, GpuCard
from tunepilot.train.arithmetic import plan_updates

MIN_HEADROOM = 0.10
"""Share of each card kept free: the caching allocator's reserved-but-free blocks live there
(a pilot on the card measures reserved minus allocated)."""
BASE_DTYPES = ("fp32", "bf16", "nf4")
TRAINING_PHASES = ("first step", "steady step")


@dataclass(frozen=True)
class Setting:
    """One dry run's knobs: what the sheet varies around the configured step."""

    microbatch: int
    checkpointing: bool
    base_dtype: str
    precision: str


class DryRuns:
    """The dry runs a sheet asks for, each run once. `run(setting)` returns a `DryRun`."""

    def __init__(self, run: Callable[[Setting], Any]) -> None:
        self._run = run
        self._done: dict[Setting, Any] = {}

    def __call__(self, setting: Setting) -> Any:
        if setting not in self._done:
            self._done[setting] = self._run(setting)
        return self._done[setting]

    @property
    def count(self) -> int:
        return len(self._done)


def updates_sheet(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """S7: examples per update, updates per epoch, examples seen; what is held and what follows.

    Takes exactly `plan_updates`'s arguments; the sheet adds what follows and the rule.
    """
    plan = plan_updates(*args, **kwargs)
    follows = "epochs and examples seen" if plan.held == "updates" else "updates"
    return {
        **plan.to_json(),
        "follows": follows,
        "rule": "examples per update = microbatch x accumulation x data replicas; model "
        "parallelism does not multiply it. Holding updates fixed while changing the batch "
        "changes examples seen; holding epochs fixed changes updates (S7).",
    }


def _phase(dry: Any, name: str) -> Any | None:
    return next((p for p in dry.phases if p.phase == name), None)


@dataclass(frozen=True)
class Linear:
    """Each phase's peak as `at_one + (microbatch - 1) x slope`, from dry runs at 1 and 2."""

    at_one: dict[str, int]
    slope: dict[str, int]

    @classmethod
    def from_runs(cls, one: Any, two: Any) -> Linear:
        at_one = {p.phase: int(p.peak) for p in one.phases}
        second = {p.phase: int(p.peak) for p in two.phases}
        return cls(at_one, {k: max(0, second.get(k, v) - v) for k, v in at_one.items()})

    def peak(self, microbatch: int) -> int:
        return max(v + (microbatch - 1) * self.slope[k] for k, v in self.at_one.items())

    def largest_microbatch(self, budget: float) -> int | None:
        """Largest microbatch whose every phase fits `budget` bytes; 0 when even one does not;
        None when no phase grows with the microbatch (then any fits that fits at one)."""
        if any(v > budget for v in self.at_one.values()):
            return 0
        bounds = [
            1 + int((budget - v) // s) for k, v in self.at_one.items() if (s := self.slope[k])
        ]
        return min(bounds) if bounds else None

    def blocking(self, budget: float) -> str | None:
        """The phase that does not fit `budget` even at microbatch 1 (e.g. evaluation with a
        large eval batch), or None."""
        return next((k for k, v in self.at_one.items() if v > budget), None)


@dataclass
class SheetInputs:
    """The configured step and the work around it, read from the campaign once."""

    microbatch: int
    accumulation: int
    max_length: int
    checkpointing: bool
    base_dtype: str
    precision: str
    eval_batches: int  # batches in one full validation pass
    updates_per_run: int
    n_variants: int
    n_seeds: int
    evals_per_run: int
    checkpoints_per_run: int
    margin: float
    packages: tuple[int, ...]
    assumptions: list[str] = field(default_factory=list)

    @property
    def setting(self) -> Setting:
        return Setting(self.microbatch, self.checkpointing, self.base_dtype, self.precision)


def sheet_inputs(campaign: Any, n_train: int, n_validation: int, base_dtype: str) -> SheetInputs:
    """The configured step, updates per run (S7) and validation passes, from the campaign."""
    from tunepilot.train.precision import resolve_precision

    t, d, r = campaign.training, campaign.data, campaign.rental
    precision, _ = resolve_precision(t.precision, "cuda", bf16_supported=True)  # as sized
    replicas = t.distributed.nproc if t.distributed.strategy != "none" else 1
    plan = plan_updates(n_train, t.microbatch, t.accumulation, replicas, updates=t.budget.updates,
                        epochs=t.budget.epochs, drop_last=t.drop_last)  # fmt: skip
    total = plan.total_updates
    return SheetInputs(
        t.microbatch, t.accumulation, d.max_length, t.activation_checkpointing, base_dtype,
        precision, max(1, math.ceil(n_validation / t.eval_batch_size)), total,
        len(campaign.variants), max(1, len(campaign.seeds)), math.ceil(total / t.eval_every),
        math.ceil(total / t.checkpoint_every) if t.checkpoint_every else 1, r.margin,
        tuple(sorted(r.packages_days)),
    )  # fmt: skip


def _input_of(dry: Any) -> str | None:
    """What one example is when it is not tokens: an image campaign's "image 3x224x224"."""
    image = dry.phases[0].inputs.get("image") if dry.phases else None
    return f"image {image}" if image else None


def work_of(dry: Any, inputs: SheetInputs, precision: str | None = None) -> tuple[Any, Any]:
    """(WorkFlops, WorkBytes) of the campaign from one dry run of its step (L3). FLOPs are split
    by the precision each operator computed in; a dry run without that split counts all of
    them in `precision` (default: training.precision)."""
    precision = precision or inputs.precision
    from tunepilot.sizing.timing import WorkBytes, work_flops

    steady, evaluation = _phase(dry, "steady step"), _phase(dry, "evaluation")
    if steady is None:
        raise input_error(
            "dry run", "no `steady step` phase", "report this: the dry run is incomplete"
        )
    per_step = inputs.accumulation / max(1, int(steady.inputs.get("accumulation", 1)))
    update_by = {k: v * per_step for k, v in steady.flops_by_precision(precision).items()}
    eval_by = ({k: v * inputs.eval_batches
                for k, v in evaluation.flops_by_precision(precision).items()}
               if evaluation is not None else {})  # fmt: skip
    trainable = dry.trainable_params * 4 + steady.optimizer
    full = dry.trainable_params >= dry.total_params
    passes = 3 if steady.inputs.get("activation_checkpointing") else 2  # + the recompute
    decode = 1 + dry.generated_tokens  # the forward, each new token
    io = WorkBytes(checkpoint=trainable, base_weights=steady.weights,
                   export=steady.weights if full else dry.trainable_params * 4,
                   update_reads=steady.weights * passes * inputs.accumulation,
                   eval_reads=(evaluation.weights * decode * inputs.eval_batches
                               if evaluation is not None else 0))  # fmt: skip
    return work_flops(update_by, eval_by), io


def _fit(card: GpuCard, peak: int, context: int) -> dict[str, Any]:
    """Verdict of a per-GPU tensor peak plus the device context on `card`, with headroom."""
    need = peak + context
    headroom = 1.0 - need / card.memory_bytes
    if headroom >= MIN_HEADROOM:
        verdict, why = "PASS", f"fits with {headroom:.0%} headroom"
    elif headroom >= 0:
        verdict, why = "WARN", f"fits with only {headroom:.0%} headroom"
    else:
        verdict, why = (
            "FAIL",
            f"needs {human_bytes(need)}, {human_bytes(-headroom * card.memory_bytes)} more",
        )
    return {"verdict": verdict, "peak_bytes": need, "headroom": round(headroom, 4), "sentence": why}


def multi_gpu_bytes(dry: Any, gpus: int) -> tuple[int, int]:
    """(DDP, FSDP) tensor bytes per GPU on `gpus` GPUs, arithmetic on the dry run's split at its
    highest phase: DDP adds its gradient buckets (a flat fp32 copy of every trained weight's
    gradient, allocated when the model is wrapped and held throughout: tunepilot keeps trained
    weights in fp32) to a full replica; FSDP shards weights, gradients and optimizer state and
    gathers one block's weights at a time."""
    top = dry.peak()
    state = top.weights + top.gradients + top.optimizer
    block = top.weights // max(1, dry.layers)
    buckets = 4 * dry.trainable_params
    return top.peak + buckets, top.peak - state + math.ceil(state / gpus) + block


def _multi_gpu(dry: Any, card: GpuCard, context: int) -> dict[str, Any] | None:
    """DDP vs FSDP bytes per GPU on a machine of `card.gpus` cards (B3, B4)."""
    if card.gpus < 2:
        return None
    ddp, fsdp = multi_gpu_bytes(dry, card.gpus)
    return {
        "gpus": card.gpus,
        "ddp_per_gpu": _fit(card, ddp, context),
        "fsdp_per_gpu": _fit(card, fsdp, context),
        "sentence": (
            f"DDP keeps a full replica per GPU plus its gradient buckets, an fp32 copy of "
            f"the trained weights' gradients: {human_bytes(ddp)} per GPU; FSDP shards weights, "
            f"gradients and optimizer state over "
            f"{card.gpus} and gathers one block at a time: {human_bytes(fsdp)}; arithmetic on "
            f"the dry run's {dry.peak().phase} split (B3, B4)"
        ),
    }


def card_rows(
    runs: DryRuns,
    inputs: SheetInputs,
    catalog: Catalog,
    *,
    seconds_for: Callable[[GpuCard], tuple[Any, str]],
) -> dict[str, Any]:
    """The sheet: the configured step on every card, then S3's two options, each sized apart.

    `seconds_for(card)` gives (PhaseSeconds or None, basis sentence) for the rental package.
    """
    from tunepilot.sizing.rental import plan_rental

    base = inputs.setting
    configured = runs(base)
    ckpt = {
        on: Linear.from_runs(runs(Setting(1, on, base.base_dtype, base.precision)),
                             runs(Setting(2, on, base.base_dtype, base.precision)))
        for on in (False, True)
    }  # fmt: skip
    dtypes = {d: _peak_or_none(runs, Setting(base.microbatch, base.checkpointing, d,
                                             base.precision)) for d in BASE_DTYPES}  # fmt: skip
    other = "bf16" if base.precision == "fp32" else "fp32"
    alt = runs(Setting(base.microbatch, base.checkpointing, base.base_dtype, other))
    flops, io = work_of(configured, inputs)
    context = int(configured.cuda_context_bytes)
    rows = []
    top = configured.peak()
    for card in catalog.cards:
        budget = card.memory_bytes * (1 - MIN_HEADROOM) - context
        seconds, basis = seconds_for(card)
        fit = _fit(card, top.peak, context)
        if fit["verdict"] == "FAIL":
            seconds, basis = None, f"no hours: the configured step does not fit the {card.name}"
        package = None
        if seconds is not None:
            prices = {d: card.package_price(d) for d in inputs.packages}
            plan = plan_rental(seconds, inputs.updates_per_run, inputs.n_variants, inputs.n_seeds,
                               inputs.evals_per_run, gpus_in_package=card.gpus,
                               margin=inputs.margin, prices=prices,
                               checkpoints_per_run=inputs.checkpoints_per_run,
                               packages=inputs.packages)  # fmt: skip
            package = {"hours": round(plan.total_hours, 2), "measured": plan.measured,
                       "days": plan.chosen.days if plan.chosen else None,
                       "cost": plan.chosen.cost_sentence if plan.chosen else None,
                       "sentence": plan.sentence, "plan": plan.to_json()}  # fmt: skip
        rows.append({
            "card": card.name, "backend": card.backend, "gpus": card.gpus,
            "memory_bytes": card.memory_bytes, "peak_phase": top.phase,
            "configured": fit,
            "largest_microbatch": {"without checkpointing": ckpt[False].largest_microbatch(budget),
                                   "with checkpointing": ckpt[True].largest_microbatch(budget),
                                   "blocked_by": ckpt[True].blocking(budget)},
            "base_dtypes_that_fit": [d for d, peak in dtypes.items() if peak is not None
                                     and _fit(card, peak, context)["verdict"] == "PASS"],
            "multi_gpu": _multi_gpu(configured, card, context), "package": package,
            "basis": basis,
        })  # fmt: skip
    return {
        "model": configured.model, "architecture": configured.architecture,
        "layers": configured.layers, "blocks_measured": list(configured.blocks_measured),
        "configured": asdict(base) | {"max_length": inputs.max_length,
                                      "accumulation": inputs.accumulation,
                                      "input": _input_of(configured)},
        "phases": [asdict(p) for p in configured.phases],
        "notes": list(configured.notes),
        "checkpointing": _option_effect(ckpt, base.microbatch, runs, base),
        "precision": _precision_effect((configured, flops), (alt, work_of(alt, inputs, other)[0]),
                                       base.precision, other, catalog),
        "base_dtypes": {d: peak for d, peak in dtypes.items()},
        "hours_basis": (
            f"computed from the dry run's {flops.per_update:.3g} FLOPs per update "
            f"({flops.shares()}, the precisions its operators computed in) and "
            f"{flops.per_eval_pass:.3g} per validation pass / (each card's dense peak for each "
            f"precision x {catalog.assumed_mfu:.0%} MFU, an ASSUMPTION until a pilot on that "
            "card measures the step), never faster than reading the weights at the card's "
            "datasheet memory bandwidth (each microbatch's forward and backward, each generated "
            "token); checkpoint, resume and export from their bytes at an "
            f"ASSUMED {catalog.assumed_disk_gb_s:g} GB/s disk"
        ),
        "dry_runs": runs.count, "rows": rows,
        "assumptions": [f"{human_bytes(context)} per GPU for the device context, outside the "
                        "counted tensors (the dry run's figure) until a pilot on the card "
                        "measures it",
                        f"{MIN_HEADROOM:.0%} of each card kept free (allocator cache, "
                        "fragmentation)"] + inputs.assumptions,
    }  # fmt: skip


def _peak_or_none(runs: DryRuns, setting: Setting) -> int | None:
    """A base dtype's peak, or None where the dry run refuses it (e.g. an architecture that
    bitsandbytes does not quantize); the sheet then lists the dtype as not sized."""
    try:
        return int(runs(setting).peak().peak)
    except InputError:
        return None


def _option_effect(
    ckpt: dict[bool, Linear], microbatch: int, runs: DryRuns, base: Setting
) -> dict[str, Any]:
    """Activation checkpointing off and on at the configured microbatch: peak and FLOPs."""
    out: dict[str, Any] = {}
    for on in (False, True):
        dry = runs(Setting(microbatch, on, base.base_dtype, base.precision))
        steady = _phase(dry, "steady step")
        out["on" if on else "off"] = {"peak_bytes": ckpt[on].peak(microbatch),
                                      "steady_flops": steady.flops if steady else None}  # fmt: skip
    off, on = out["off"], out["on"]
    saved = off["peak_bytes"] - on["peak_bytes"]
    extra = (on["steady_flops"] / off["steady_flops"] - 1) if off["steady_flops"] else math.nan
    without, with_ = human_bytes(off["peak_bytes"]), human_bytes(on["peak_bytes"])
    out["sentence"] = (
        f"activation checkpointing at microbatch {microbatch}: peak {without} without, "
        f"{with_} with ({human_bytes(saved)} saved); the step computes {extra:+.0%} FLOPs "
        "(the recomputed forward), so each update takes that much longer (dry runs of both, S3)"
    )
    return out


def _precision_effect(
    configured: tuple[Any, Any], alt: tuple[Any, Any], precision: str, other: str,
    catalog: Catalog,
) -> dict[str, Any]:  # fmt: skip
    """The configured precision against the other one, each a (dry run, WorkFlops): peak bytes,
    and per card the update's time with the other over its time as configured (each
    precision's FLOPs at that precision's dense peak; a card lacking one gives None)."""
    from tunepilot.sizing.timing import WorkBytes, computed_seconds

    none = WorkBytes(0, 0, 0)

    def update_seconds(card: GpuCard, flops: Any) -> float | None:
        found = computed_seconds(card, catalog, flops, none)
        return found.update if found is not None else None

    speed = {}
    for c in catalog.cards:
        mine_s, theirs_s = update_seconds(c, configured[1]), update_seconds(c, alt[1])
        speed[c.name] = mine_s / theirs_s if mine_s and theirs_s else None
    mine, theirs = configured[0].peak().peak, alt[0].peak().peak
    return {
        "configured": precision, "other": other, "peak_bytes": {precision: mine, other: theirs},
        "peak_speedup": speed,
        "flops_shares": {precision: configured[1].shares(), other: alt[1].shares()},
        "sentence": (
            f"training.precision {precision}: peak {human_bytes(mine)}, FLOPs "
            f"{configured[1].shares()}; {other}: peak {human_bytes(theirs)}, FLOPs "
            f"{alt[1].shares()} (dry runs of both, autocast's casts replayed); time per update "
            f"with {other} relative to {precision}, each precision's FLOPs at its dense peak: "
            + ", ".join(f"{k} x{1 / v:.2f}" for k, v in list(speed.items())[:3] if v) + " (S3)"
        ),
    }  # fmt: skip
