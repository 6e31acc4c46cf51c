"""What to try when a pilot phase runs out of memory (S6), each phase with its own knobs.

A training step's memory follows the microbatch, activation checkpointing, the precision and
the sharding; evaluation has none of those (no gradients, no optimizer state, no backward): its
peak follows `training.eval_batch_size` and the longest validation example. Advising a
training knob for an evaluation that ran out of memory sends the user to change the experiment
for nothing, so `oom_proposals` picks the list by the phase that failed.
"""

from __future__ import annotations

from typing import Any

EVALUATION_PHASES = ("evaluation",)


def oom_proposals(state: Any, inputs: dict[str, Any], phase: str = "") -> list[str]:
    """S6, in order: what to try when `phase` runs out of memory at `inputs`."""
    if phase in EVALUATION_PHASES:
        return evaluation_proposals(state, inputs)
    return step_proposals(state, inputs)


def evaluation_proposals(state: Any, inputs: dict[str, Any]) -> list[str]:
    """Evaluation's own knobs: its batch, then the longest validation example (S6)."""
    t = state.training
    batch = int(inputs.get("microbatch") or t.eval_batch_size)
    out = [f"1) training.eval_batch_size={max(1, batch // 2)} (evaluation only: the same "
           "examples and metrics, more batches; `tunepilot plan` gives the largest eval "
           "batch that fits each card)" if batch > 1 else
           "1) the eval batch is already 1: it cannot free more"]  # fmt: skip
    lengths = sorted(len(e.input_ids) for e in getattr(state.encoded, "validation", None) or [])
    if lengths:
        out.append(f"2) the longest validation example has {lengths[-1]} tokens (the "
                   f"median {lengths[len(lengths) // 2]}): evaluation is sized by it; "
                   "check the validation split for an outlier (`tunepilot data audit`), never "
                   "a shorter data.max_length that cuts answers (S6)")  # fmt: skip
    gen = getattr(t, "max_new_tokens", None)
    if state.kind != "classification" and gen:
        out.append(f"3) training.max_new_tokens={gen}: the KV cache of generation grows "
                   "with it; lower it only if no answer needs that many tokens")  # fmt: skip
    return out


def step_proposals(state: Any, inputs: dict[str, Any]) -> list[str]:
    """S6, in order: what to try when a training step runs out of memory at `inputs`."""
    t = state.training
    mb, acc = int(inputs["microbatch"]), int(inputs["accumulation"])
    out: list[str] = []
    if mb > 1:
        smaller = mb // 2
        more = acc * mb // smaller if (acc * mb) % smaller == 0 else acc * 2
        out.append(
            f"1) training.microbatch={smaller} with training.accumulation={more} (same "
            f"{mb * acc} examples per update; activations shrink, weights and optimizer state "
            "do not)"
        )
    else:
        out.append("1) the microbatch is already 1: accumulation cannot free more activations")
    out.append(
        "2) training.activation_checkpointing=true (recomputes activations in backward)"
        if not inputs["activation_checkpointing"]
        else "2) activation checkpointing is already on"
    )
    out.append(
        "3) training.precision=bf16 (on a card with bf16; fp16 on one without)"
        if inputs["precision"] == "fp32"
        else f"3) precision is already {inputs['precision']}"
    )
    out.append(
        "4) a sharded strategy: training.distributed.strategy=fsdp over several GPUs (B4)"
        if t.distributed.strategy != "fsdp"
        else "4) FSDP is already on: add GPUs"
    )
    out.append("5) " + shorter_length_advice(state))
    return out


def shorter_length_advice(state: Any) -> str:
    """S6: a shorter max_length only when the audit shows no target would be cut."""
    max_length = state.campaign.data.max_length
    lengths = sorted(
        len(e.input_ids) for e in (state.encoded.train if state.encoded is not None else [])
    )
    if not lengths:
        return "a shorter data.max_length cannot be judged: the data was not encoded"
    shorter = lengths[min(len(lengths) - 1, int(0.95 * (len(lengths) - 1)))]
    if shorter >= max_length or shorter >= lengths[-1]:
        return (
            f"a shorter data.max_length would not help: the longest example has {lengths[-1]} "
            f"tokens and max_length is {max_length}"
        )
    cut = sum(1 for n in lengths if n > shorter)
    if state.kind == "classification":
        return (
            f"data.max_length={shorter} (the 95th percentile) cuts the text of {cut} training "
            "examples but no target (classification); check the audit that the end of a text "
            "cannot decide its class"
        )
    return (
        f"not a shorter data.max_length: at {shorter} tokens {cut} training examples would "
        "lose answer tokens, and a fit bought by cutting the answer is another experiment"
    )


