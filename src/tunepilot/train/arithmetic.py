"""How many examples make an update, and how many updates make a run (S7).

Pure Python on purpose: the pilot's sizing sheet and `tunepilot validate` use this before
any model exists, and it must never import torch.

The one formula everything else follows:

    examples per update = microbatch x accumulation x data replicas

Data replicas are the processes that each see *different* examples (DDP ranks, FSDP ranks).
Model parallelism (one model split over several GPUs) does not multiply the effective batch,
so it never appears here. A comparison holds either the number of updates or the number of
epochs fixed; the other one follows, and the plan records both so the ledger can show what a
variant really changed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from tunepilot.errors import InputError, Problem

Held = Literal["updates", "epochs"]


@dataclass(frozen=True)
class UpdatePlan:
    """The arithmetic of one run, computed once and recorded with it (S7)."""

    n_examples: int
    microbatch: int
    accumulation: int
    replicas: int
    drop_last: bool
    held: Held  # what the comparison holds fixed; the other quantity follows
    examples_per_update: int
    updates_per_epoch: int
    partial_update_examples: int  # size of the last update of an epoch when it is partial, else 0
    dropped_per_epoch: int  # examples never seen in an epoch because drop_last cut them
    total_updates: int
    epochs: float  # epochs covered by total_updates (may be fractional)
    examples_seen: int

    @property
    def examples_per_epoch(self) -> int:
        """Examples actually used in one full pass (all of them unless drop_last cut some)."""
        return self.n_examples - self.dropped_per_epoch

    def examples_after(self, updates: int) -> int:
        """Examples seen after `updates` updates, counting partial updates exactly."""
        full_epochs, rest = divmod(updates, self.updates_per_epoch)
        # `rest` < updates_per_epoch, so every one of those updates is a full one: the only
        # partial update of an epoch is its last.
        return full_epochs * self.examples_per_epoch + rest * self.examples_per_update

    def describe(self) -> str:
        """One sentence for the sizing sheet, the run header and the ledger."""
        replicas = f" x {self.replicas} replicas" if self.replicas > 1 else " x 1 replica"
        sentence = (
            f"{self.microbatch} per microbatch x {self.accumulation} accumulations{replicas} "
            f"= {self.examples_per_update} examples per update; {self.n_examples:,} training "
            f"examples give {self.updates_per_epoch} updates per epoch"
        )
        if self.partial_update_examples:
            sentence += f" (the last one partial, {self.partial_update_examples} examples)"
        if self.dropped_per_epoch:
            sentence += f" ({self.dropped_per_epoch} examples dropped per epoch by drop_last)"
        if self.held == "updates":
            sentence += (
                f". Holding {self.total_updates} updates fixed: "
                f"{self.examples_seen:,} examples seen = {self.epochs:.3g} epochs."
            )
        else:
            sentence += (
                f". Holding {self.epochs:.3g} epochs fixed: "
                f"{self.total_updates} updates, {self.examples_seen:,} examples seen."
            )
        return sentence

    def to_json(self) -> dict[str, Any]:
        """Plain JSON for state.json, the ledger and the sizing sheet."""
        return {**asdict(self), "sentence": self.describe()}


def plan_updates(
    n_examples: int,
    microbatch: int,
    accumulation: int,
    replicas: int = 1,
    *,
    updates: int | None = None,
    epochs: float | None = None,
    drop_last: bool = False,
) -> UpdatePlan:
    """Work out the plan; exactly one of `updates` or `epochs` is held fixed.

    With `drop_last=False` the examples left over at the end of an epoch form one last,
    partial update (the loop normalises its loss by its own target count, S2). With
    `drop_last=True` they are skipped and counted in `dropped_per_epoch`.
    """
    problems = []
    for key, value in (
        ("training.microbatch", microbatch),
        ("training.accumulation", accumulation),
        ("training.distributed.nproc", replicas),
    ):
        if value < 1:
            problems.append(Problem(key, f"{value}", "use a whole number >= 1"))
    if n_examples < 1:
        problems.append(
            Problem("data", "no training examples", "check the data file and the split fractions")
        )
    if (updates is None) == (epochs is None):
        problems.append(
            Problem("training.budget", "not exactly one of updates/epochs", "set one of them")
        )
    if problems:
        raise InputError(problems, title="cannot plan the updates")

    per_update = microbatch * accumulation * replicas
    full_updates, leftover = divmod(n_examples, per_update)
    if drop_last:
        if full_updates == 0:
            raise InputError(
                [
                    Problem(
                        "training.drop_last",
                        f"{n_examples} examples cannot fill one update of {per_update} "
                        f"({microbatch} x {accumulation} x {replicas})",
                        "set training.drop_last to false, or lower microbatch/accumulation",
                    )
                ],
                title="cannot plan the updates",
            )
        per_epoch, partial, dropped = full_updates, 0, leftover
    else:
        per_epoch = full_updates + (1 if leftover else 0)
        partial, dropped = leftover, 0

    if updates is not None:
        held: Held = "updates"
        total = updates
    else:
        held = "epochs"
        assert epochs is not None
        # A tolerance so that 0.1 epochs x 200 updates is 20 updates, not 21.
        total = max(1, math.ceil(epochs * per_epoch - 1e-9))

    plan = UpdatePlan(
        n_examples=n_examples,
        microbatch=microbatch,
        accumulation=accumulation,
        replicas=replicas,
        drop_last=drop_last,
        held=held,
        examples_per_update=per_update,
        updates_per_epoch=per_epoch,
        partial_update_examples=partial,
        dropped_per_epoch=dropped,
        total_updates=total,
        epochs=0.0,
        examples_seen=0,
    )
    seen = plan.examples_after(total)
    covered = seen / plan.examples_per_epoch if held == "updates" else float(epochs or 0.0)
    return UpdatePlan(**{**asdict(plan), "examples_seen": seen, "epochs": covered})


def plan_from_settings(n_examples: int, settings: Any, replicas: int | None = None) -> UpdatePlan:
    """The plan for a campaign's `TrainingSettings`.

    `replicas` defaults to the data replicas the settings ask for: `nproc` under DDP or FSDP
    (both give each rank different examples), 1 otherwise.
    """
    if replicas is None:
        dist = settings.distributed
        replicas = dist.nproc if dist.strategy in ("ddp", "fsdp") else 1
    return plan_updates(
        n_examples,
        settings.microbatch,
        settings.accumulation,
        replicas,
        updates=settings.budget.updates,
        epochs=settings.budget.epochs,
        drop_last=settings.drop_last,
    )
