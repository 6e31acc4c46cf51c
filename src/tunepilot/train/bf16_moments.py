"""AdamW whose two moments are stored in bf16 (`training.optimizer: adamw_bf16_states`).

torch's AdamW keeps its moments in the parameters' dtype (fp32 weights: 8 bytes of state per
trained weight) and refuses moments of another dtype ("expected dtype BFloat16 for `end`").
This optimizer halves the state of fp32 weights: the moments are stored in bf16 and each step
computes in fp32 from them, one parameter at a time (the fp32 moments of one parameter are its
only temporaries). It is written here because neither torch nor the libraries tunepilot
already installs ship it (torchao's low-bit AdamW would be one more CUDA-first dependency).

The update is torch's AdamW (decoupled weight decay, bias-corrected moments, eps outside the
square root); with fp32 moments it gives torch's numbers to rounding, which the tests check.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class AdamWBf16Moments(torch.optim.Optimizer):
    """AdamW with bf16 `exp_avg` / `exp_avg_sq`; `step` is a 0-d fp32 tensor like torch's."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:  # fmt: skip
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay})  # fmt: skip

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                state["step"] += 1
                step = float(state["step"])
                grad = p.grad.float()
                exp_avg = state["exp_avg"].float().lerp_(grad, 1 - beta1)
                exp_avg_sq = state["exp_avg_sq"].float().mul_(beta2)
                exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)
                state["exp_avg"].copy_(exp_avg)
                state["exp_avg_sq"].copy_(exp_avg_sq)
                p.mul_(1 - lr * decay)
                denom = exp_avg_sq.sqrt_().div_(math.sqrt(1 - beta2**step)).add_(eps)
                if p.dtype == torch.float32:
                    p.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))
                else:
                    p.sub_(exp_avg.div_(denom).mul_(lr / (1 - beta1**step)).to(p.dtype))
        return loss
