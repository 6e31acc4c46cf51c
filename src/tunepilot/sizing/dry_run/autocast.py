"""`torch.autocast` for a step on meta tensors: the casts a mixed-precision run inserts.

Why: `training.precision: bf16` (or fp16) runs the forward under `torch.autocast`, which casts
the inputs of every matmul-like operator to the half type before autograd records it, so the
half copies (of activations, and of every fp32 weight that feeds a matmul) are what backward
keeps. That is the memory and time effect of the precision option (S3). Autocast acts only on
tensors of its own device, and a meta tensor has none: under `torch.autocast("cuda")` a meta
matmul stays fp32. This mode replays the same policy one level up, on the Python calls
(`F.linear`, `torch.matmul`, `x.softmax`, ...), so autograd records each cast exactly as it
records autocast's own, and the storage tracker sees the half copies.

The policy is PyTorch's (aten/src/ATen/autocast_mode.cpp), per device type:
- lower precision: the matmul, convolution and attention operators are computed in the half
  type; an fp32 leaf that requires grad (a trained weight) is cast once per autocast region
  and the copy is cached until the region ends, as autocast's weight cache does;
- fp32 (CUDA only, beyond the losses): exp, log, pow, rsqrt, layer_norm, group_norm, ... run
  on fp32 copies of half inputs;
- fp32 output dtype (CUDA): softmax, log_softmax, sum, cumsum, prod, norms without an explicit
  dtype return fp32.
The CPU lists are smaller (no layer_norm, no elementwise fp32 list): the CPU variant is what
the validation benchmark compares with a real `torch.autocast("cpu")` step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from tunepilot.model.base_dtype import torch_dtype

_MATMULS = {
    "linear", "matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "conv1d", "conv2d",
    "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "prelu", "scaled_dot_product_attention", "linalg_vecdot",
}  # fmt: skip
LOWER = {
    "cuda": _MATMULS | {"einsum", "mv", "addmv", "addr", "chain_matmul", "multi_dot"},
    "cpu": _MATMULS,
}
_LOSSES = {
    "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
    "binary_cross_entropy_with_logits", "cosine_embedding_loss", "hinge_embedding_loss",
    "poisson_nll_loss", "margin_ranking_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "multilabel_margin_loss", "cdist",
}  # fmt: skip
FP32 = {
    "cuda": _LOSSES | {
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
        "reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "group_norm",
        "cosine_similarity", "dist", "pdist", "renorm", "logsumexp",
    },
    "cpu": _LOSSES | {"binary_cross_entropy", "prod", "trace", "ctc_loss"},
}  # fmt: skip
FP32_OUTPUT = {
    "cuda": {"softmax", "log_softmax", "sum", "cumsum", "cumprod", "prod", "vector_norm",
             "matrix_norm"},
    "cpu": set(),
}  # fmt: skip
LOWER_NOW: list[Any] = []
"""The innermost active region's cast to the half type: the attention stand-in
(`dry_run.attention`) runs above this mode and casts q, k and v through it, as autocast
casts the inputs of `scaled_dot_product_attention`."""


def _eligible(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor) and value.is_floating_point()
        and value.dtype != torch.float64
    )  # fmt: skip


class MetaAutocast(TorchFunctionMode):
    """Autocast's casts on any device, meta included, with autocast's weight cache."""

    def __init__(self, precision: str, device: str) -> None:
        super().__init__()
        self.dtype = torch_dtype(precision)
        self.device = "cuda" if device == "cuda" else "cpu"
        self._cached: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __enter__(self) -> MetaAutocast:
        LOWER_NOW.append(self._lower)
        return super().__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *exc: Any) -> Any:
        LOWER_NOW.remove(self._lower)
        self._cached.clear()  # autocast drops its cached weight casts at the region's end
        return super().__exit__(*exc)

    def _lower(self, value: Any) -> Any:
        if not _eligible(value) or value.dtype == self.dtype:
            return value
        cacheable = value.dtype == torch.float32 and value.requires_grad and value.is_leaf
        if cacheable and id(value) in self._cached:
            return self._cached[id(value)][1]
        cast = value.to(self.dtype)
        if cacheable:
            self._cached[id(value)] = (value, cast)  # the source kept alive, as autocast does
        return cast

    @staticmethod
    def _fp32(value: Any) -> Any:
        return value.float() if _eligible(value) and value.dtype != torch.float32 else value

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in LOWER[self.device]:
            args, kwargs = tree_map(self._lower, (args, kwargs))
        elif name in FP32[self.device]:
            args, kwargs = tree_map(self._fp32, (args, kwargs))
        elif (name in FP32_OUTPUT[self.device] and args and _eligible(args[0])
              and kwargs.get("dtype") is None
              and not any(isinstance(a, torch.dtype) for a in args)):  # fmt: skip
            kwargs = {**kwargs, "dtype": torch.float32}
        return func(*args, **kwargs)

