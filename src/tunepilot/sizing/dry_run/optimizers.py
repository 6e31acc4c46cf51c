"""The campaign's optimizer in a dry run (S1): torch's own on meta tensors; bitsandbytes' 8-bit
AdamW by the state it allocates, since bitsandbytes has no meta-tensor kernels.

torch's optimizers (AdamW, SGD, Adafactor, tunepilot's bf16-moment AdamW) run on meta tensors
unchanged, so their state and their step's temporaries are measured, not assumed. A CUDA run
steps AdamW with the fused kernel (one kernel per group, no intermediate tensors); the dry run
steps torch's for-loop AdamW in its place, whose per-parameter temporaries (one
parameter-sized buffer at a time) bound the fused kernel's from above.

bitsandbytes' `AdamW8bit` / `PagedAdamW8bit` (block-wise, `min_8bit_size` 4096) allocate, per
trained tensor of n elements: two uint8 moments of n bytes each and two fp32 absmax vectors of
ceil(n / 256) values; a tensor under 4096 elements keeps two fp32 moments instead; two 256-entry
fp32 quantile maps are shared by all. Its update is computed in place inside one kernel (no
temporaries). The stand-in below allocates exactly those tensors on the first step. The paged
variant allocates its moments with cudaMallocManaged, outside torch's caching allocator: the
driver keeps them on the GPU while there is room and pages them to host RAM under pressure.
Those bytes are never in a phase's peak; they are reported apart as `host_paged` (what host
RAM must hold at worst) and the GPU script compares both with bitsandbytes itself.
"""

from __future__ import annotations

from typing import Any

from tunepilot.campaign.optimizer_rules import BITSANDBYTES_OPTIMIZERS

BNB_BLOCK = 256
BNB_MIN_8BIT_SIZE = 4096


def bitsandbytes_state_bytes(numel: int) -> int:
    """Bytes bitsandbytes' 8-bit AdamW keeps for one trained tensor of `numel` elements."""
    if numel < BNB_MIN_8BIT_SIZE:
        return 2 * 4 * numel
    blocks = -(-numel // BNB_BLOCK)
    return 2 * numel + 2 * 4 * blocks


def dry_run_optimizer(model: Any, training: Any) -> Any:
    """The optimizer a run of `training` builds, for a model on meta tensors."""
    from tunepilot.train.optimizer import build_optimizer, optimizer_factory

    if training.optimizer in BITSANDBYTES_OPTIMIZERS:
        paged = training.optimizer == "paged_adamw_8bit"
        return build_optimizer(model, training,
                               factory=lambda ps: BitsandbytesStandIn(ps, paged))  # fmt: skip
    # foreach=False: the for-loop kernel stands in for the fused one (see above)
    return build_optimizer(model, training,
                           factory=optimizer_factory(training, training.lr, "meta", False))


def paged_bytes(optimizer: Any) -> int:
    """Bytes of optimizer state held in CUDA unified memory (outside the allocator)."""
    inner = getattr(optimizer, "optimizers", [optimizer])
    return sum(getattr(o, "paged", 0) for o in inner)


def _make_base() -> type:
    import torch

    class _StandIn(torch.optim.Optimizer):
        """bitsandbytes 8-bit AdamW's state on meta tensors; the update itself changes nothing
        a byte count can see (bitsandbytes computes it in place)."""

        def __init__(self, params: Any, paged: bool) -> None:
            super().__init__(params, {"lr": 1e-3})
            self.is_paged = paged
            self.paged_of: dict[int, int] = {}  # id(param) -> bytes in unified memory

        @property
        def paged(self) -> int:
            return sum(self.paged_of.values())

        @torch.no_grad()
        def step(self, closure: Any = None) -> Any:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None or self.state[p] or id(p) in self.paged_of:
                        continue
                    if self.is_paged:  # outside the allocator: a byte count, no tensor
                        self.paged_of[id(p)] = bitsandbytes_state_bytes(p.numel())
                    else:
                        self.state[p]["state"] = _state_tensors(p)
            return None

    return _StandIn


def _state_tensors(p: Any) -> list[Any]:
    import torch

    n = p.numel()
    if n < BNB_MIN_8BIT_SIZE:
        return [torch.empty(n, dtype=torch.float32, device=p.device) for _ in range(2)]
    blocks = -(-n // BNB_BLOCK)
    return [torch.empty(n, dtype=torch.uint8, device=p.device) for _ in range(2)] + [
        torch.empty(blocks, dtype=torch.float32, device=p.device) for _ in range(2)
    ]


class BitsandbytesStandIn:
    """Factory shim: `BitsandbytesStandIn(params, paged)` builds the torch Optimizer subclass
    above (made lazily so that importing this module does not import torch)."""

    _cls: type | None = None

    def __new__(cls, params: Any, paged: bool) -> Any:  # type: ignore[misc]
        if cls._cls is None:
            cls._cls = _make_base()
        return cls._cls(params, paged)
