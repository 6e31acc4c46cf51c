"""Control inputs (R2): what the trained model *in memory* answers, recorded before export.

`tunepilot verify` replays these inputs from the bundle's files alone in a new process; the
answers must match (labels identical and logits within tolerance, or identical greedy text).
"""

from __future__ import annotations

import hashlib
from typing import Any

from tunepilot.deliver.bundle_check import IMAGES_FILE, LOGIT_TOLERANCE
from tunepilot.tasks.example import Example

CONTROL_COUNT = 8


def choose_controls(examples: list[Example], n: int = CONTROL_COUNT) -> list[Example]:
    """`n` examples chosen by a hash of their id, round-robin over labels: the same data always
    gives the same controls, and a classifier's controls cover several classes."""
    by_label: dict[str, list[Example]] = {}
    for e in sorted(examples, key=lambda e: hashlib.sha256(e.id.encode("utf-8")).hexdigest()):
        by_label.setdefault(str(e.label), []).append(e)
    queues = [by_label[k] for k in sorted(by_label)]
    chosen: list[Example] = []
    while len(chosen) < n and any(queues):
        for queue in queues:
            if queue and len(chosen) < n:
                chosen.append(queue.pop(0))
    return chosen


def compute_controls(
    model: Any, encoder: Any, examples: list[Example], max_new_tokens: int
) -> dict[str, Any]:
    """What the in-memory model answers to each control input: logits and label, or the greedy
    text. One example at a time (no padding), inputs as token ids *and* as text, so the check
    can tell a changed tokenizer from a changed model."""
    import torch

    tokenizer = encoder.tokenizer
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    inputs: list[dict[str, Any]] = []
    images = hasattr(encoder, "processor")
    tensors: dict[str, Any] = {}
    try:
        with torch.no_grad():
            for e in examples:
                if images:
                    inputs.append(_image_control(model, encoder, e, device, tensors))
                elif encoder.kind == "classification":
                    inputs.append(_classification_control(model, encoder, e, device))
                else:
                    inputs.append(
                        _generation_control(model, encoder, tokenizer, e, device, max_new_tokens)
                    )
    finally:
        model.train(was_training)
    kind = "image_classification" if images else encoder.kind
    out: dict[str, Any] = {"kind": kind, "device": device.type, "inputs": inputs}
    out |= logit_tolerance(model, inputs)
    if encoder.kind == "classification":
        out["labels"] = list(encoder.label_names)
        out["model_inputs"] = "input_ids and attention_mask (token_type_ids left to the model)"
    if images:
        out["model_inputs"] = f"pixel_values from the bundle's image processor; {IMAGES_FILE}"
        out["tensors"] = tensors  # written beside control.json by the export
    return out


def logit_tolerance(model: Any, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The logit tolerance of the replay. An fp32 model replays to 1e-5. A frozen base in
    bf16 or fp16 computes in that precision once reloaded by plain transformers + peft (a head
    trained in fp32 is loaded into a copy of the base's module, in the base's dtype), so two
    of its ulps at the largest logit; a label may differ only where the recorded logits tie
    within that."""
    import torch

    from tunepilot.model.base_dtype import low_precision_base

    low = low_precision_base(model)
    if low is None:
        return {}
    largest = max((abs(x) for c in inputs for x in c.get("logits") or []), default=1.0)
    ulp = torch.finfo(low).eps * max(1.0, largest)
    name = str(low).removeprefix("torch.")
    return {"logit_tolerance": max(LOGIT_TOLERANCE, 2 * ulp),
            "logit_tolerance_reason": f"two {name} ulps at the largest logit ({largest:.3g}): "
            f"the base computes in {name}"}  # fmt: skip


def _image_control(
    model: Any, encoder: Any, e: Example, device: Any, tensors: dict[str, Any]
) -> dict[str, Any]:
    """One image control. IMAGES_FILE holds the decoded RGB array (uint8, height x width x 3)
    and the pixel_values training computed from it: verify re-runs the bundle's own image
    processor on the first and compares with the second, so a changed processor is told apart
    from a changed model."""
    import numpy as np
    import torch

    key = f"control-{len(tensors) // 2}"
    pixels = encoder.encode(e).pixel_values  # the evaluation view: no augmentation
    tensors[f"{key}.image"] = torch.from_numpy(np.array(encoder.decode(e).image, dtype=np.uint8))
    tensors[f"{key}.pixel_values"] = pixels.contiguous()
    logits = model(pixel_values=pixels[None].to(device)).logits[0].float()
    return {
        "id": e.id,
        "file": e.text,
        "image_key": key,
        "gold_label": e.label,
        "expected_label": encoder.label_names[int(logits.argmax())],
        "logits": logits.cpu().tolist(),
    }


def _classification_control(model: Any, encoder: Any, e: Example, device: Any) -> dict[str, Any]:
    import torch

    encoded = encoder.encode(e)
    text, pair = encoder.segments(e)  # exactly the segments training tokenized
    ids = torch.tensor([encoded.input_ids], device=device)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    pred = int(logits.argmax())
    return {
        "id": e.id,
        "text": text,
        "text_pair": pair,
        "max_length": encoder.max_length,
        "input_ids": list(encoded.input_ids),
        "gold_label": e.label,
        "expected_label": encoder.label_names[pred],
        "logits": logits.cpu().tolist(),
    }


def _generation_control(
    model: Any, encoder: Any, tokenizer: Any, e: Example, device: Any, max_new_tokens: int
) -> dict[str, Any]:
    import torch

    prompt = encoder.prompt_ids(e)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    ids = torch.tensor([prompt], device=device)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        pad_token_id=pad,
        eos_token_id=eos,
    )[0, len(prompt) :].tolist()
    new = out[: out.index(eos)] if eos in out else out
    return {
        "id": e.id,
        "prompt_text": encoder.render_prompt(e),
        "add_special_tokens": not encoder.uses_chat_template,
        "max_length": encoder.max_length,
        "input_ids": list(prompt),
        "max_new_tokens": max_new_tokens,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "expected_ids": new,
        "expected_text": tokenizer.decode(new, skip_special_tokens=True),
        "reference_answer": encoder.answer_text(e),
    }
