"""The per-card selection sheet (L1, S1, S3, S6, B3, B4): what the campaign's exact step needs
on every card of the catalog, from a handful of GPU-free dry runs.

Every memory number here is a dry run's: the campaign's model built from its config on fake
tensors, its step executed phase by phase (`sizing.dry_run`). Nothing is an assumed share:

- each card is judged by the one verdict (`sizing.fit.fit`) on a dry run at settings it can
  run (model.base_dtype unset: bf16 where the card has it, fp32 where not): every phase with
  the headroom policy, every precision the step computes in; a machine of several GPUs under
  each layout it can run (side by side, DDP, FSDP), the fastest that fits planned
  (`sizing.machine`). Only a PASS row gets hours, a package and a cost;
- activation bytes are linear in the microbatch at a fixed length, so the dry runs at
  microbatch 1 and 2 give each phase's exact slope, and the largest microbatch per card
  follows without calling the dry run again;
- activation checkpointing, precision and the evaluation batch are each sized by their own
  dry runs on the phase they change (`sizing.options`, S3);
- the base dtypes (fp32, bf16, nf4) are dry runs at the configured shape.

About nine dry runs, each once (`DryRuns` keeps them), each announced on stderr as it starts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tunepilot.errors import InputError, input_error
from tunepilot.measure.memory import human_bytes
from tunepilot.sizing.catalog import Catalog, GpuCard
from tunepilot.sizing.fit import MIN_HEADROOM, fit, machine_fits, resolved_base
from tunepilot.train.arithmetic import plan_updates

BASE_DTYPES = ("fp32", "bf16", "nf4")


@dataclass(frozen=True)
class Setting:
    """One dry run's knobs: what the sheet varies around the configured step."""

    microbatch: int
    checkpointing: bool
    base_dtype: str
    precision: str
    eval_batch: int | None = None  # None: the campaign's training.eval_batch_size

    def describe(self) -> str:
        ckpt = "on" if self.checkpointing else "off"
        said = (f"microbatch {self.microbatch}, checkpointing {ckpt}, base {self.base_dtype}, "
                f"precision {self.precision}")  # fmt: skip
        return said + (f", eval batch {self.eval_batch}" if self.eval_batch else "")


class DryRuns:
    """The dry runs a sheet asks for, each run once. `run(setting)` returns a `DryRun`. Each
    new one is announced on stderr when it starts and when it ends, so a plan that takes a
    minute is never silent (`--json` keeps stdout for its document)."""

    def __init__(self, run: Callable[[Setting], Any], *, announce: bool = True) -> None:
        self._run = run
        self._done: dict[Setting, Any] = {}
        self.announce = announce

    def __call__(self, setting: Setting) -> Any:
        if setting not in self._done:
            from tunepilot.progress import start_line

            tick = time.monotonic()
            if self.announce:
                start_line(f"dry run {len(self._done) + 1}: {setting.describe()}")
            self._done[setting] = self._run(setting)
            if self.announce:
                start_line(f"dry run {len(self._done)} done in {time.monotonic() - tick:.1f} s")
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
    base_unset: bool = False  # model.base_dtype unset: each card loads what it can (bf16/fp32)
    eval_batch: int = 32
    eval_batch_set: bool = True  # False: training.eval_batch_size unset, each card's own
    campaign_file: str = "campaign.yaml"
    first_seed: int = 0
    attention: str | None = None  # model.attn_implementation

    @property
    def setting(self) -> Setting:
        return Setting(self.microbatch, self.checkpointing, self.base_dtype, self.precision)

    @property
    def examples_per_update(self) -> int:
        return self.microbatch * self.accumulation

    def on(self, card: GpuCard) -> Setting:
        """The configured step as `card` runs it: the base dtype the run loads there."""
        base = resolved_base(card, None if self.base_unset else self.base_dtype)
        return replace(self.setting, base_dtype=base)


def sheet_inputs(campaign: Any, n_train: int, n_validation: int, base_dtype: str,
                 campaign_file: str = "campaign.yaml") -> SheetInputs:  # fmt: skip
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
        tuple(sorted(r.packages_days)), base_unset=campaign.model.base_dtype is None,
        eval_batch=t.eval_batch_size, eval_batch_set="eval_batch_size" in t.model_fields_set,
        campaign_file=campaign_file,
        first_seed=(list(campaign.seeds) or [0])[0],
        attention=campaign.model.attn_implementation,
    )  # fmt: skip


def _input_of(dry: Any) -> str | None:
    """What one example is when it is not tokens: an image campaign's "image 3x224x224"."""
    image = dry.phases[0].inputs.get("image") if dry.phases else None
    return f"image {image}" if image else None


def _length_share(dry: Any, phase: Any, mean: float | None) -> float:
    """The data's mean length over the length `phase` was sized at (1 without data lengths):
    hours follow the tokens a run really computes, memory the longest example."""
    sized = phase.inputs.get("length") if phase is not None else None
    return min(1.0, mean / sized) if mean and sized else 1.0


def work_of(dry: Any, inputs: SheetInputs, precision: str | None = None) -> tuple[Any, Any]:
    """(WorkFlops, WorkBytes) of the campaign from one dry run of its step (L3). FLOPs are split
    by the precision each operator computed in (a dry run without that split counts all of
    them in `precision`, default training.precision) and scaled from the longest example to
    the data's mean padded length (linear in tokens: attention's share makes it a slight
    overestimate); QLoRA's dequantisation bytes are counted per pass."""
    precision = precision or inputs.precision
    from tunepilot.sizing.throughput import method_of
    from tunepilot.sizing.timing import WorkBytes, work_flops

    steady, evaluation = _phase(dry, "steady step"), _phase(dry, "evaluation")
    if steady is None:
        raise input_error(
            "dry run", "no `steady step` phase", "report this: the dry run is incomplete"
        )
    per_step = inputs.accumulation / max(1, int(steady.inputs.get("accumulation", 1)))
    train_share = _length_share(dry, steady, getattr(dry, "mean_length", None))
    eval_share = _length_share(dry, evaluation, getattr(dry, "mean_eval_length", None))
    update_by = {k: v * per_step * train_share
                 for k, v in steady.flops_by_precision(precision).items()}  # fmt: skip
    eval_by = ({k: v * inputs.eval_batches * eval_share
                for k, v in evaluation.flops_by_precision(precision).items()}
               if evaluation is not None else {})  # fmt: skip
    # the trained weights as stored (training.weights_dtype: 2 bytes each in bf16, 4 in fp32)
    weights_bytes = dry.trainable_bytes or dry.trainable_params * 4
    trainable = weights_bytes + steady.optimizer + steady.host_paged
    full = dry.trainable_params >= dry.total_params
    passes = 3 if steady.inputs.get("activation_checkpointing") else 2  # + the recompute
    decode = 1 + dry.generated_tokens  # the forward, each new token
    io = WorkBytes(checkpoint=trainable, base_weights=steady.weights,
                   export=steady.weights if full else weights_bytes,
                   update_reads=steady.weights * passes * inputs.accumulation,
                   eval_reads=(evaluation.weights * decode * inputs.eval_batches
                               if evaluation is not None else 0))  # fmt: skip
    stored = 0.5 + 1 / 64 if steady.inputs.get("base_dtype") == "nf4" else 1.0
    dequant = getattr(dry, "quantized_params", 0) * (stored + 2) * passes * inputs.accumulation
    return work_flops(update_by, eval_by, method_of(dry), dequant), io


def card_rows(
    runs: DryRuns,
    inputs: SheetInputs,
    catalog: Catalog,
    *,
    seconds_for: Callable[[GpuCard, Any], tuple[Any, str]],
) -> dict[str, Any]:
    """The sheet: the configured step on every card, then S3's options, each sized apart.

    `seconds_for(card, dry_run)` gives (PhaseSeconds or None, basis sentence) for the package.
    """
    from tunepilot.sizing.options import checkpointing_effect, eval_batch_effect, precision_effect
    from tunepilot.sizing.recommend import ranking_rule

    base = inputs.setting
    configured = runs(base)
    ckpt = {
        on: Linear.from_runs(runs(replace(base, microbatch=1, checkpointing=on)),
                             runs(replace(base, microbatch=2, checkpointing=on)))
        for on in (False, True)
    }  # fmt: skip
    dtypes = {d: _run_or_none(runs, replace(base, base_dtype=d)) for d in BASE_DTYPES}
    other = "bf16" if base.precision == "fp32" else "fp32"
    alt = runs(replace(base, precision=other))
    at_one = runs(replace(base, eval_batch=1)) if inputs.eval_batch > 1 else configured
    flops, _ = work_of(configured, inputs)
    rows = [_row(card, runs, inputs, ckpt, dtypes, seconds_for) for card in catalog.cards]
    return {
        "model": configured.model, "architecture": configured.architecture,
        "layers": configured.layers, "blocks_measured": list(configured.blocks_measured),
        "configured": asdict(base) | {"max_length": inputs.max_length,
                                      "accumulation": inputs.accumulation,
                                      "eval_batch_size": inputs.eval_batch,
                                      "input": _input_of(configured)},
        "phases": [asdict(p) for p in configured.phases],
        "peak_phase": configured.peak().phase,
        "notes": list(configured.notes),
        "checkpointing": checkpointing_effect(
            runs(replace(base, checkpointing=False)), runs(replace(base, checkpointing=True)),
            base.microbatch),
        "eval_batch": eval_batch_effect(configured, at_one, inputs.eval_batch),
        "precision": precision_effect((configured, flops), (alt, work_of(alt, inputs, other)[0]),
                                      base.precision, other, catalog),
        "base_dtypes": {d: (int(dry.peak().peak) if dry is not None else None)
                        for d, dry in dtypes.items()},
        "hours_basis": _hours_basis(flops, catalog),
        "ranking": ranking_rule(),
        "dry_runs": runs.count, "rows": rows,
        "assumptions": [f"{human_bytes(int(configured.cuda_context_bytes))} per GPU for the "
                        "device context, outside "
                        "the counted tensors (the dry run's figure) until a pilot on the card "
                        "measures it",
                        f"{MIN_HEADROOM:.0%} of each card kept free (allocator cache, "
                        "fragmentation): a row that fits with less is WARN and gets no package"]
                       + inputs.assumptions,
    }  # fmt: skip


def row_plan(card: GpuCard, runs: DryRuns, inputs: SheetInputs,
             seconds_for: Callable[[GpuCard, Any], tuple[Any, str]]) -> dict[str, Any]:  # fmt: skip
    """Everything one card's row is made from: the dry run at the settings it can run, the
    verdict under each layout (the one `fit`), the layout shown, and its RentalPlan (None
    unless a layout PASSes). `plan --gpu` reads the same to print the target's package."""
    from tunepilot.sizing.eval_fit import card_setting
    from tunepilot.sizing.machine import plan_machine

    setting, dry, batch = card_setting(card, runs, inputs, inputs.on(card))  # eval_fit.py
    fits = machine_fits(card, dry)
    passing = any(f.passes for f in fits)
    seconds, basis = seconds_for(card, dry) if passing else (None, "")
    prices = {d: card.package_price(d) for d in inputs.packages}
    extra = f" training.eval_batch_size={batch}" * (batch != inputs.eval_batch)
    shown, plan, why = plan_machine(card, fits, seconds, inputs, prices, extra)
    if plan is not None:
        basis = plan.basis
    elif not basis:
        basis = f"no hours: {shown.verdict} on the {card.name}: {shown.sentence}"
    return {"setting": setting, "dry": dry, "fits": fits, "shown": shown, "plan": plan,
            "why": why, "basis": basis, "eval_batch": batch}  # fmt: skip


def _row(card: GpuCard, runs: DryRuns, inputs: SheetInputs, ckpt: dict[bool, Linear],
         dtypes: dict[str, Any], seconds_for: Callable[[GpuCard, Any], tuple[Any, str]],
         ) -> dict[str, Any]:  # fmt: skip
    """One card's row: its verdict (the one `fit`), its layout, hours and package if PASS."""
    made = row_plan(card, runs, inputs, seconds_for)
    setting, dry, fits, shown, plan = (made[k] for k in ("setting", "dry", "fits", "shown",
                                                          "plan"))  # fmt: skip
    package = None
    if plan is not None:
        package = {"hours": round(plan.total_hours, 2), "measured": plan.measured,
                   "hours_range": [round(h, 2) for h in plan.hours_range],
                   "days": plan.chosen.days if plan.chosen else None,
                   "cost": plan.chosen.cost_sentence if plan.chosen else None,
                   "price": plan.chosen.price if plan.chosen else None,
                   "sentence": plan.sentence, "plan": plan.to_json()}  # fmt: skip
    budget = card.memory_bytes * (1 - MIN_HEADROOM) - int(dry.cuda_context_bytes)
    same_base = setting.base_dtype == inputs.base_dtype
    split = _phase(dry, "steady step").flops_by_precision(inputs.precision)
    main = max(split, key=lambda k: split[k])  # the precision most of the step computes in
    return {
        "card": card.name, "backend": card.backend, "gpus": card.gpus, "arch": card.arch,
        "stack": card.stack, "memory_bytes": card.memory_bytes, "base_dtype": setting.base_dtype,
        "configured": shown.to_json(), "peak_phase": shown.phase,
        "layouts": [f.to_json() for f in fits] if card.gpus > 1 else None,
        "layout_choice": made["why"], "eval_batch": made["eval_batch"],
        "largest_microbatch": {
            "without checkpointing": ckpt[False].largest_microbatch(budget) if same_base else None,
            "with checkpointing": ckpt[True].largest_microbatch(budget) if same_base else None,
            "blocked_by": ckpt[True].blocking(budget) if same_base else None,
            "sized": same_base},
        "base_dtypes_that_fit": [d for d, other in dtypes.items() if other is not None
                                 and fit(card, other, shown.layout).passes],
        "machine_peak_flops": card.gpus * (card.peak_flops(main) or 0.0),
        "package": package, "basis": made["basis"],
    }  # fmt: skip


def _hours_basis(flops: Any, catalog: Catalog) -> str:
    from tunepilot.sizing.throughput import utilisation

    util = utilisation(flops.method, flops.precision)
    own = ("; your own `mfu` replaces it where the catalog sets one" if catalog.assumed_mfu
           is None and any(c.mfu for c in catalog.cards) else "")  # fmt: skip
    if catalog.assumed_mfu is not None:
        said = f"your own {catalog.assumed_mfu:.0%} (catalog assumed_mfu)"
    else:
        said = (f"{util.expected:.0%}, range {util.low:.0%}-{util.high:.0%}, {util.basis}"
                f"{own}")  # fmt: skip
    return (
        f"computed from the dry run's {flops.per_update:.3g} FLOPs per update "
        f"({flops.shares()}, the precisions its operators computed in, at the data's mean "
        f"length) and {flops.per_eval_pass:.3g} per validation pass / (each card's dense peak "
        f"for each precision x the utilisation of {flops.method}: {said}); a pilot on a card "
        "replaces it by the measured step; never faster than reading the weights at the "
        "card's datasheet memory bandwidth (each microbatch's forward and backward, each "
        "generated token); checkpoint, resume and export from their bytes at an ASSUMED "
        f"{catalog.assumed_disk_gb_s:g} GB/s disk"
    )


def _run_or_none(runs: DryRuns, setting: Setting) -> Any | None:
    """A base dtype's dry run, or None where the dry run refuses it (e.g. an architecture that
    bitsandbytes does not quantize); the sheet then lists the dtype as not sized."""
    try:
        return runs(setting)
    except InputError:
        return None
