"""nf4 / int8 bases in a dry run: the storage bitsandbytes keeps, counted without bitsandbytes.

The meta run computes in bf16 (QLoRA's compute dtype). On the GPU, transformers' bitsandbytes
quantizer replaces every frozen `nn.Linear` of the base except the ones it keeps in full
precision (the output head: `get_keys_to_not_convert`) by 4- or 8-bit storage, and peft's
`prepare_model_for_kbit_training` casts every other frozen tensor to fp32. Sizes, per weight
of n elements in blocks of 64:
- nf4 with double quantization: n/2 bytes of codes, an 8-bit absmax per block and an fp32
  scale per 256 absmax values: n/2 + n/64 + 4n/(64*256) bytes;
- int8 (LLM.int8): n bytes and an fp32 scale per output row.
The forward and backward of a quantized layer dequantize its weight to bf16 for the matmul:
one such weight (the largest) is added as a temporary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tunepilot.model.base_dtype import QUANTIZED


@dataclass
class QuantizedStorage:
    """Per-parameter storage bytes on the GPU for a (possibly) quantized base."""

    base_dtype: str
    sizes: dict[str, int] = field(default_factory=dict)  # parameter name -> bytes
    largest_dequantized: int = 0
    quantized_elements: int = 0  # elements of every quantized weight (each pass dequantizes)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, model: Any, base_dtype: str) -> QuantizedStorage:
        out = cls(base_dtype)
        if base_dtype not in QUANTIZED:
            return out
        import torch
        from transformers.quantizers.base import get_keys_to_not_convert

        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        keep = set(get_keys_to_not_convert(base) or [])
        for name, module in model.named_modules():
            weight = getattr(module, "weight", None)
            if (
                type(module) is not torch.nn.Linear
                or weight is None
                or weight.requires_grad
                or any(k and (name.endswith(k) or f".{k}." in name) for k in keep)
            ):
                continue
            n, rows = weight.numel(), weight.shape[0]
            nbytes = n // 2 + n // 64 + 4 * n // (64 * 256) if base_dtype == "nf4" else n + 4 * rows
            out.sizes[f"{name}.weight"] = nbytes
            out.largest_dequantized = max(out.largest_dequantized, n * 2)
            out.quantized_elements += n
        for name, param in model.named_parameters():
            if name not in out.sizes and not param.requires_grad and param.is_floating_point():
                out.sizes[name] = param.numel() * 4
        out.notes.append(
            f"{base_dtype}: frozen linear weights counted at bitsandbytes {base_dtype} storage "
            "(output head kept as transformers keeps it), other frozen tensors in "
            "fp32 (prepare_model_for_kbit_training); compute sized in bf16 (analytical)"
        )
        return out

    def bytes_of(self, name: str, param: Any) -> int:
        if name in self.sizes:
            return self.sizes[name]
        return param.numel() * param.element_size()

    def temporaries(self) -> dict[str, int]:
        if not self.largest_dequantized:
            return {}
        return {"one weight dequantized to bf16 for its matmul (analytical)":
                self.largest_dequantized}  # fmt: skip
