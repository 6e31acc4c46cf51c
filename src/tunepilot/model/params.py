"""Which parameters train, and proof that an update changes exactly those (P2, P3).

`trainable_report` records per module counts, dtype and bytes, target modules, LoRA rank and the
extra saved layers; `update_audit` snapshots every tensor, runs real updates and diffs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from tunepilot.verdict import Finding, Verdict

_PEFT_PREFIX = "base_model.model."


@dataclass
class ModuleRow:
    module: str
    params: int
    dtype: str
    bytes: int
    trainable: bool


@dataclass
class TrainableReport:
    """Trainable and frozen parameters per module, with the LoRA settings compared across runs."""

    method: Literal["full", "lora"]
    rows: list[ModuleRow]
    trainable_params: int
    frozen_params: int
    trainable_bytes: int
    frozen_bytes: int
    target_modules: list[str]
    adapted_modules: list[str]
    lora_rank: int | None
    lora_alpha: int | None
    extra_saved: dict[str, int]  # modules_to_save actually wrapped -> trainable params
    frozen_dtypes: list[str] = field(default_factory=list)  # the base as loaded (base_dtype)
    trainable_dtypes: list[str] = field(default_factory=list)  # what trains (fp32 kept)

    @property
    def total_params(self) -> int:
        return self.trainable_params + self.frozen_params

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["total_params"] = self.total_params
        return out

    def print(self, console: Any = None) -> None:
        """A Rich table; repeated layers fold into one row (`layer.*.attention...`)."""
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        share = self.trainable_params / max(self.total_params, 1)
        title = (
            f"{self.method}: {self.trainable_params:,} trainable of {self.total_params:,} "
            f"({share:.2%})"
        )
        if self.method == "lora":
            title += f" · r={self.lora_rank} alpha={self.lora_alpha} on {self.target_modules}"
        if self.extra_saved:
            title += f" · saved whole: {sorted(self.extra_saved)}"
        folded: dict[tuple[str, bool, str], list[int]] = {}
        for row in self.rows:
            key = (re.sub(r"\.\d+\.", ".*.", row.module), row.trainable, row.dtype)
            acc = folded.setdefault(key, [0, 0, 0])
            acc[0] += 1
            acc[1] += row.params
            acc[2] += row.bytes
        table = Table(title=title)
        table.add_column("module", overflow="fold")  # full names: they are what users grep
        for column in ("n", "params", "dtype", "MiB", "trainable"):
            table.add_column(column, justify="right", no_wrap=True)
        for (module, trainable, dtype), (n, params, size) in sorted(
            folded.items(), key=lambda kv: (not kv[0][1], kv[0][0])
        ):
            table.add_row(
                module,
                str(n),
                f"{params:,}",
                dtype,
                f"{size / 2**20:.2f}",
                "yes" if trainable else "",
            )
        console.print(table)


def _as_list(targets: Any) -> list[str]:
    """peft stores target_modules as a set, a regex string or None."""
    if not targets:
        return []
    return [targets] if isinstance(targets, str) else sorted(targets)


def trainable_report(model: Any) -> TrainableReport:
    """Count every parameter once, by owning module, trainable or frozen (P2)."""
    groups: dict[tuple[str, bool, str], list[int]] = {}
    for name, param in model.named_parameters():
        module = name.removeprefix(_PEFT_PREFIX).rsplit(".", 1)[0]
        key = (module, bool(param.requires_grad), str(param.dtype).removeprefix("torch."))
        acc = groups.setdefault(key, [0, 0])
        acc[0] += param.numel()
        acc[1] += param.numel() * param.element_size()
    rows = [ModuleRow(m, n, d, b, t) for (m, t, d), (n, b) in groups.items()]
    peft_config = getattr(model, "peft_config", None)
    cfg = peft_config.get(getattr(model, "active_adapter", "default")) if peft_config else None
    targets = cfg.target_modules if cfg is not None else None
    adapted, extra = [], {}
    for name, module in model.named_modules():
        short = name.removeprefix(_PEFT_PREFIX)
        if hasattr(module, "lora_A") and hasattr(module, "base_layer"):
            adapted.append(short)
        if type(module).__name__ == "ModulesToSaveWrapper":
            extra[short] = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return TrainableReport(
        method="lora" if cfg is not None else "full",
        rows=rows,
        trainable_params=sum(r.params for r in rows if r.trainable),
        frozen_params=sum(r.params for r in rows if not r.trainable),
        trainable_bytes=sum(r.bytes for r in rows if r.trainable),
        frozen_bytes=sum(r.bytes for r in rows if not r.trainable),
        target_modules=_as_list(targets),
        adapted_modules=adapted,
        lora_rank=getattr(cfg, "r", None),
        lora_alpha=getattr(cfg, "lora_alpha", None),
        extra_saved=extra,
        frozen_dtypes=sorted({r.dtype for r in rows if not r.trainable}),
        trainable_dtypes=sorted({r.dtype for r in rows if r.trainable}),
    )


# --------------------------------------------------------------------------------------------
# P3: an update changes exactly the expected parameters
# --------------------------------------------------------------------------------------------

_INT_VIEW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _same_bits(a: Any, b: Any) -> bool:
    """Bitwise equality (NaN == NaN, -0.0 != 0.0): "unchanged" means the same bytes."""
    import torch

    if a.dtype.is_floating_point:
        kind = getattr(torch, _INT_VIEW[a.element_size()])
        return torch.equal(a.contiguous().view(kind), b.contiguous().view(kind))
    return torch.equal(a, b)


def update_audit(
    model: Any,
    make_batch_loss: Callable[[Any], Any],
    optimizer_factory: Callable[[Any], Any],
    updates: int = 2,
) -> list[Finding]:
    """P3: run `updates` complete updates (loss, backward, optimizer step) and diff every tensor.

    The set of tensors that changed must equal the set that was trainable before the audit;
    frozen tensors must be bitwise unchanged. Two updates, not one, because LoRA's B starts at
    zero, so lora_A gets a zero gradient on the first step and AdamW (without weight decay) does
    not move it: a
    trainable tensor is judged "moved within `updates` updates". One that never moved is named
    with its gradient norm (None: the loss does not reach it).

    `make_batch_loss(model)` returns a scalar loss; `optimizer_factory(model)` builds a *fresh*
    optimizer, as training would. Afterwards the parameters, requires_grad flags, gradients,
    train/eval mode and torch RNG state are restored: the audit leaves the model as it found it,
    and the optimizer it built (with its state) is dropped. The snapshot is a host-RAM copy
    of every parameter (the model's size), kept off the accelerator so the audit cannot be
    the step that runs out of device memory.
    """
    import torch

    params = dict(model.named_parameters())
    before = {n: p.detach().to("cpu", copy=True) for n, p in params.items()}
    flags = {n: p.requires_grad for n, p in params.items()}
    grads = {n: p.grad for n, p in params.items()}
    expected = {n for n, f in flags.items() if f}
    was_training = model.training
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    grad_norms: dict[str, float | None] = {}
    losses: list[float] = []
    moved_after: dict[str, int] = {}
    try:
        for p in params.values():
            p.grad = None
        model.train()
        optimizer = optimizer_factory(model)
        for step in range(1, updates + 1):
            optimizer.zero_grad(set_to_none=True)
            loss = make_batch_loss(model)
            losses.append(float(loss.detach()))
            loss.backward()
            optimizer.step()
            for n, p in params.items():
                grad_norms[n] = None if p.grad is None else float(p.grad.detach().norm())
                if n not in moved_after and not _same_bits(before[n], p.detach().cpu()):
                    moved_after[n] = step
        flipped = sorted(n for n, p in params.items() if p.requires_grad != flags[n])
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(before[n].to(p.device))
                p.requires_grad_(flags[n])
                p.grad = grads[n]
        model.train(was_training)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)

    findings = []
    changed_frozen = sorted(set(moved_after) - expected)
    if changed_frozen:
        why = (
            f"; requires_grad was switched on during the update for {flipped[:5]}"
            if flipped
            else ""
        )
        findings.append(
            Finding(
                "update-frozen-unchanged",
                Verdict.FAIL,
                f"{len(changed_frozen)} frozen tensors changed in an update (e.g. "
                f"{changed_frozen[:3]}){why}; build the optimizer over trainable parameters only",
                "P3",
                examples=changed_frozen[:20],
                details={"changed_frozen": changed_frozen, "requires_grad_flipped": flipped},
            )
        )
    else:
        findings.append(
            Finding(
                "update-frozen-unchanged",
                Verdict.PASS,
                f"all {len(params) - len(expected)} frozen tensors bitwise unchanged",
                "P3",
            )
        )
    still = sorted(expected - set(moved_after))
    if still:
        shown = {n: grad_norms.get(n) for n in still[:5]}
        no_grad = [n for n in still if grad_norms.get(n) is None]
        findings.append(
            Finding(
                "update-trainable-moved",
                Verdict.FAIL if no_grad else Verdict.WARN,
                f"{len(still)} trainable tensors did not move in {updates} updates (gradient "
                f"norms {shown}); "
                + (
                    "the loss does not reach them: freeze them or connect them"
                    if no_grad
                    else "their gradients are zero or too small for the learning rate"
                    + _half_ulp_note(params, still)
                ),
                "P3",
                examples=still[:20],
                details={"not_moved": still, "grad_norms": {n: grad_norms.get(n) for n in still}},
            )
        )
    else:
        late = sorted(n for n, s in moved_after.items() if s > 1 and n in expected)
        findings.append(
            Finding(
                "update-trainable-moved",
                Verdict.PASS,
                f"all {len(expected)} trainable tensors moved within {updates} updates"
                + (
                    f" ({len(late)} only from update 2, e.g. LoRA A after B left zero)"
                    if late
                    else ""
                ),
                "P3",
                details={"moved_from_update_2": late, "losses": losses},
            )
        )
    if not all(math.isfinite(x) for x in losses):
        findings.append(
            Finding("update-finite-loss", Verdict.FAIL, f"non-finite loss {losses}", "P3")
        )
    return findings


def _half_ulp_note(params: dict[str, Any], still: list[str]) -> str:
    """Why a bf16 weight stands still: an update under half its ulp rounds away."""
    import torch

    if not any(params[n].dtype == torch.bfloat16 for n in still):
        return ""
    return ("; these are bf16 weights (training.weights_dtype=bf16): an update under half a "
            "bf16 ulp of the weight rounds away (a weight of 1.0 moves only by 0.004 or more); "
            "a larger lr, or training.weights_dtype=fp32, moves them")
