"""`export --merge`: the adapter folded into its base, for servers that load one plain model.

vLLM, TGI and plain `from_pretrained` users often want one folder with no peft at load time.
peft's own `merge_and_unload` adds each LoRA product into the base weight it adapts (and puts
a trained `modules_to_save` copy, such as a new head, in place of the original); the result is
saved as safetensors in the dtype the base was loaded in, next to the adapter, which stays the
primary artefact. `tunepilot verify` replays the control inputs on this folder too (R2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunepilot.errors import input_error


def save_merged(model: Any, tokenizer: Any, folder: Path) -> None:
    """Merge `model` (a PeftModel) into its base and save it to `folder`.

    The merge happens in place, so no second copy of a large base is held in memory: the
    caller must be done with `model` as an adapter (export saves the adapter first).
    """
    base = model.get_base_model()
    if getattr(base, "is_quantized", False) or getattr(base, "hf_quantizer", None) is not None:
        raise input_error(
            "--merge", "the base is loaded quantized; merging into quantized weights rounds "
            "the adapter away", "export without --merge, or merge into the base loaded in "
            "bf16/fp32 with peft yourself", title="merge refused",
        )  # fmt: skip
    dtype = next(base.parameters()).dtype
    merged = model.merge_and_unload()
    merged.to(dtype)
    merged.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
