"""The precision of the frozen base (`model.base_dtype`), resolved once and recorded.

A 7B base in fp32 takes twice the memory a user who loads it in bf16 sees, so the precision
of the frozen weights is a campaign setting, not a constant. Unset, it resolves at load time:
fp32 on CPU (bit-identical to earlier runs), bf16 on a CUDA GPU that has bf16. `nf4` and
`int8` quantize the frozen base with bitsandbytes through transformers' own
`BitsAndBytesConfig` (the QLoRA recipe: nf4, double quantization, bf16 compute); that
training needs CUDA, so elsewhere it is refused with the way forward (`tunepilot size` still
sizes it). Whatever the base, trained weights (LoRA, modules_to_save, full fine-tuning) are
kept in `training.weights_dtype`: fp32 by default (AdamW updates smaller than a bf16 ulp would
otherwise vanish), bf16 for pure bf16 training.
"""

from __future__ import annotations

from typing import Any

from tunepilot.errors import input_error

BASE_DTYPES = ("fp32", "bf16", "fp16", "nf4", "int8")
QUANTIZED = ("nf4", "int8")
_TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def resolve_base_dtype(requested: str | None, device_type: str | None = None) -> tuple[str, str]:
    """(`model.base_dtype` as it will load, a sentence saying why) for a device type.

    `device_type` None means "the device this process trains on": cuda when one is visible.
    """
    if device_type is None:
        device_type = default_device_type()
    if requested is not None:
        return requested, f"base weights in {requested} (model.base_dtype)"
    if device_type == "cuda" and cuda_has_bf16():
        return "bf16", "base weights in bf16 (model.base_dtype unset: bf16 on this CUDA GPU)"
    return "fp32", f"base weights in fp32 (model.base_dtype unset: fp32 on {device_type})"


def torch_dtype(name: str) -> Any:
    """The torch dtype the base's unquantized tensors hold; quantized bases compute in bf16."""
    import torch

    return getattr(torch, _TORCH_NAMES.get(name, "bfloat16"))


def quant_compute_dtype(device_type: str | None = None) -> str:
    """What a quantized base computes in: bf16 (QLoRA's choice), fp16 on a CUDA card without
    bf16 (T4, V100), where bf16 kernels are emulated or refused."""
    device_type = device_type or default_device_type()
    return "fp16" if device_type == "cuda" and not cuda_has_bf16() else "bf16"


def quantization_config(name: str, compute: str = "bf16") -> Any:
    """transformers' BitsAndBytesConfig for nf4 (QLoRA) or int8, None for a plain dtype;
    `compute` is the dtype the dequantized matmuls run in (`quant_compute_dtype`)."""
    if name not in QUANTIZED:
        return None
    from transformers import BitsAndBytesConfig

    if name == "nf4":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch_dtype(compute),
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def require_quantization_backend(name: str, device_type: str | None = None) -> None:
    """Refuse nf4/int8 training where bitsandbytes' 4/8-bit kernels cannot run (CPU here), or
    on a GPU without bitsandbytes installed (transformers would stop with an ImportError)."""
    if name not in QUANTIZED:
        return
    device_type = device_type or default_device_type()
    if device_type == "cuda":
        import importlib.util

        if importlib.util.find_spec("bitsandbytes") is None:
            raise input_error(
                "model.base_dtype",
                f"{name} quantizes the base with bitsandbytes, which is not installed here",
                "pip install bitsandbytes (the build for this CUDA or ROCm torch), or set "
                "model.base_dtype=bf16",
                title="base precision not available",
            )
        return
    raise input_error(
        "model.base_dtype",
        f"{name} (bitsandbytes {'4' if name == 'nf4' else '8'}-bit) training needs a CUDA "
        f"GPU and this machine trains on {device_type}",
        "set model.base_dtype=bf16 or fp32 to run here; `tunepilot size CAMPAIGN` still "
        f"sizes the {name} campaign without a GPU, and it trains on the rented CUDA card",
        title="base precision not available",
    )


def keep_trainable_in(model: Any, weights_dtype: str = "fp32") -> list[str]:
    """Cast every trainable parameter to `training.weights_dtype` (fp32 or bf16), in place;
    notes say which. fp32 is the default: AdamW updates smaller than a bf16 ulp would vanish.
    bf16 is pure bf16 training (the trained weights, their gradients and torch AdamW's state
    in bf16), the recipe torchtune's full fine-tunes use."""

    dtype = torch_dtype(weights_dtype)
    moved = []
    for name, param in model.named_parameters():
        if param.requires_grad and param.dtype != dtype:
            param.data = param.data.to(dtype)
            moved.append(name)
    if not moved:
        return []
    why = ("over a lower-precision base" if weights_dtype == "fp32"
           else "(training.weights_dtype=bf16)")  # fmt: skip
    return [f"{len(moved)} trainable tensors kept in {weights_dtype} {why} (e.g. {moved[0]})"]


def low_precision_base(model: Any) -> Any:
    """The half dtype (bf16 or fp16) the frozen base computes in, or None for an fp32 base."""
    import torch

    frozen = {p.dtype for p in model.parameters() if not p.requires_grad and p.is_floating_point()}
    return next((d for d in (torch.bfloat16, torch.float16) if d in frozen), None)


def bridge_trained_modules(model: Any) -> list[str]:
    """Let fp32 trained modules sit inside a lower-precision frozen base.

    A classification head kept by modules_to_save over a bf16 base gets bf16 activations; with
    autocast off (training.precision fp32, and every evaluation) its fp32 Linear stops on "mat1
    and mat2 must have the same dtype". Each outermost trained module that is not one of peft's
    LoRA layers (peft bridges those itself) casts its floating inputs up to its own dtype and
    its output back to the dtype the inputs came in (the base's when none is floating, as for
    an embedding), the rule peft applies to LoRA. Returns notes; nothing when the base is fp32.
    """
    import torch

    base = low_precision_base(model)
    if base is None:
        return []

    def all_trained_fp32(module: Any) -> bool:
        params = list(module.parameters())
        return bool(params) and all(p.requires_grad and p.dtype == torch.float32 for p in params)

    containers = (torch.nn.ModuleDict, torch.nn.ModuleList)  # never called: their members are
    roots: list[str] = []
    for name, module in model.named_modules():
        if "lora_" in name or isinstance(module, containers) or not all_trained_fp32(module):
            continue
        if any(name.startswith(f"{r}.") for r in roots):
            continue  # inside a bridged module: it runs in fp32 throughout
        _bridge(module, base)
        roots.append(name)
    if not roots:
        return []
    return [f"{len(roots)} trained fp32 module(s) over the {str(base).removeprefix('torch.')} "
            f"base take their inputs in fp32 and hand back the base's precision (e.g. "
            f"{roots[0]})"]  # fmt: skip


def _bridge(module: Any, base: Any) -> None:
    import torch

    def cast(value: Any, dtype: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(dtype) if value.is_floating_point() else value
        if isinstance(value, tuple | list):
            return type(value)(cast(v, dtype) for v in value)
        return value

    def incoming(args: tuple, kwargs: dict) -> Any:
        tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        return next((t.dtype for t in tensors if t.is_floating_point()), base)

    def before(_: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        module._tunepilot_dtype_in = incoming(args, kwargs)
        return cast(args, torch.float32), {k: cast(v, torch.float32) for k, v in kwargs.items()}

    def after(_: Any, args: tuple, kwargs: dict, output: Any) -> Any:
        return cast(output, module._tunepilot_dtype_in)

    module.register_forward_pre_hook(before, with_kwargs=True)
    module.register_forward_hook(after, with_kwargs=True)


def default_device_type() -> str:
    """cuda when this process sees a CUDA GPU, else cpu: the device a run here trains on."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cuda_has_bf16() -> bool:
    """Whether this machine's current CUDA card computes in bf16 natively."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def exercise_bitsandbytes(name: str, device: Any) -> tuple[bool, str]:
    """(ran, sentence): one bitsandbytes nf4/int8 layer forward and backward on `device` (B1).

    The bitsandbytes build must match the backend (CUDA or ROCm) and the card; a wheel built
    for another one imports fine and fails at the first kernel, so a kernel is run here.
    """
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return False, (f"model.base_dtype={name} needs bitsandbytes on a CUDA GPU and this "
                       f"runs on {device}; the pilot on the rented GPU checks it, `tunepilot "
                       "size` sizes it here")  # fmt: skip
    try:
        import bitsandbytes as bnb
    except ImportError as exc:
        return False, (f"model.base_dtype={name} but bitsandbytes does not import "
                       f"({str(exc)[:120]}); pip install bitsandbytes")  # fmt: skip
    backend = f"torch {torch.__version__}, " + (
        f"ROCm {torch.version.hip}" if getattr(torch.version, "hip", None)
        else f"CUDA {torch.version.cuda}"
    )  # fmt: skip
    try:
        if name == "nf4":
            compute = torch_dtype(quant_compute_dtype("cuda"))  # fp16 on a card without bf16
            layer = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=compute,
                                      quant_type="nf4").to(device)  # fmt: skip
            x = torch.randn(4, 64, device=device, dtype=compute, requires_grad=True)
        else:
            layer = bnb.nn.Linear8bitLt(64, 64, bias=False, has_fp16_weights=False).to(device)
            x = torch.randn(4, 64, device=device, dtype=torch.float16, requires_grad=True)
        out = layer(x)
        out.float().sum().backward()
        ok = bool(torch.isfinite(out).all()) and x.grad is not None
    except (RuntimeError, AttributeError, TypeError, ValueError) as exc:
        return False, (f"bitsandbytes {bnb.__version__} fails a {name} layer on this GPU "
                       f"({backend}): {str(exc)[:160]}; install the bitsandbytes build for "
                       "this backend, or set model.base_dtype=bf16")  # fmt: skip
    if not ok:
        return False, f"bitsandbytes {bnb.__version__} gave non-finite {name} outputs ({backend})"
    return (
        True,
        f"bitsandbytes {bnb.__version__} ran a {name} layer forward and backward ({backend})",
    )
