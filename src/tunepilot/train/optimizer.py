"""The optimizer every update uses (S2): AdamW over the trainable parameters only.

One builder for the loop, the pilot and the dry run, so what is sized is what trains.
"""

from __future__ import annotations

from typing import Any


def build_optimizer(
    model: Any, settings: Any, lr: float | None = None, foreach: bool | None = None
) -> Any:
    """AdamW over `model`'s trainable parameters with `settings` (TrainingSettings) lr and decay.

    `foreach` None lets PyTorch choose (the multi-tensor kernel on CUDA); the dry run passes
    True to size on meta tensors the kernel a CUDA run picks.
    """
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        params, lr=lr or settings.lr, weight_decay=settings.weight_decay, foreach=foreach
    )
