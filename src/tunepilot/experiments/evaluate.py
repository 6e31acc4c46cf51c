"""THE evaluation procedure: the baseline and every variant go through this one function (H3, V2).

Comparability is made explicit: `EvalResult.config` holds everything that decides what a
number means (which examples, batch size, decoding, generation budget, metric names, what the
answers are scored against) and `config_hash` is its stable hash; the encoder's identity is
recorded next to it but left out of the hash, so a max_length or template variant is judged
on the same procedure (S6). Two results are comparable only when their hashes are equal;
compare.py refuses otherwise. `answers_cut` counts evaluated examples whose answer tokens
max_length cut: what makes an encoding "not the same experiment". Predictions are kept per
example so a gain limited to a few examples shows up (H3, V5).

Decoding is greedy and batched with left padding; the new tokens are cut at the first EOS.
torch is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tunepilot.campaign import stable_hash
from tunepilot.errors import InputError, Problem
from tunepilot.progress import Progress
from tunepilot.tasks.base import IGNORE_INDEX
from tunepilot.tasks.example import Example
from tunepilot.tasks.metrics import classification_metrics, extraction_metrics, format_metrics
from tunepilot.train.batching import collate, model_inputs

PROCEDURE_VERSION = 2
"""Bumped whenever this procedure changes what a number means; part of the config hash."""


@dataclass
class EvalResult:
    """Metrics, one row per example (predictions kept), and what makes it comparable."""

    metrics: dict[str, Any]
    rows: list[dict[str, Any]]
    config: dict[str, Any]
    config_hash: str
    timings: dict[str, float] = field(default_factory=dict)
    # What the metrics are computed from beyond the rows: the summed loss and its count
    # (examples or answer tokens) and the answers max_length cut (evaluate_sharded.py).
    sums: dict[str, float] = field(default_factory=dict)


SCORED_KEYS = ("task", "required_fields", "schema", "labels")
"""Parts of the encoder's identity that decide what a number means; the rest (tokenizer,
max_length, template, loss mask) is the encoding a variant may change (S6)."""


def eval_config(
    encoder: Any, examples: list[Example], batch_size: int, max_new_tokens: int
) -> dict[str, Any]:
    """What two evaluations must share to be compared (V2). Device and timing are left out:
    the same procedure on CPU and GPU must hash the same."""
    generative = encoder.kind == "causal_lm"
    if not generative:
        metric_names = ["accuracy", "macro_f1", "micro_f1", "per_class", "loss"]
    elif encoder.task == "extraction":
        metric_names = [
            "json_validity",
            "schema_validity",
            "required_field_presence",
            "object_exact",
            "field_exact_macro",
            "field_token_f1_macro",
            "per_field",
            "loss",
        ]
    else:
        metric_names = ["exact_match", "token_f1", "loss"]
        if encoder.answers_are_json:  # the format guards' rates (H2)
            metric_names[2:2] = ["json_validity", "schema_validity", "required_field_presence"]
    encoding = encoder.describe()
    return {
        "procedure_version": PROCEDURE_VERSION,
        "kind": encoder.kind,
        "n_examples": len(examples),
        "split_ids_hash": stable_hash([e.id for e in examples]),
        "batch_size": batch_size,
        "max_new_tokens": max_new_tokens if generative else None,
        "decoding": "greedy" if generative else "argmax",
        "metric_names": metric_names,
        # what is scored: the answer contract (extraction) or the class list (classification)
        "scored_against": {k: encoding.get(k) for k in SCORED_KEYS if k in encoding},
        "encoding": encoding,
    }


def config_hash_of(config: dict[str, Any]) -> str:
    """The comparability hash (V2): the whole config except the encoding, which the data
    version records and compare.py judges on its own (same examples, answers not cut)."""
    return stable_hash({k: v for k, v in config.items() if k != "encoding"})


def evaluate(
    model: Any,
    encoder: Any,
    examples: list[Example],
    batch_size: int,
    max_new_tokens: int,
    device: str = "cpu",
    label: str | None = None,
    synced: bool = False,
    loss_chunks: int = 8,
) -> EvalResult:
    """Evaluate `model` on `examples` with the fixed procedure; the model's mode is restored.

    Classification: batched forward, argmax, rows {id, gold, pred, correct, logits}.
    Causal LM: teacher-forced loss on the answer tokens, then greedy generation from the
    prompt; rows {id, output, gold, ...extraction or format checks}.
    `label` names a standalone evaluation (baseline, sealed test) whose progress is shown;
    evaluations inside training stay quiet under the training's own progress. `synced` keeps
    generation in step with the other ranks (FSDP forwards are collectives). `loss_chunks`
    cuts a batch's loss positions (`train.loss.eval_chunks`); generation's prefill computes
    the last position's logits only (transformers' `logits_to_keep`, which `generate` sets
    where the model supports it).
    """
    import time

    import torch

    if not examples:
        raise InputError(
            [Problem("evaluation split", "no examples", "give the split at least one example")],
            title="nothing to evaluate",
        )
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError("batch_size and max_new_tokens must be >= 1")
    config = eval_config(encoder, examples, batch_size, max_new_tokens)
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    bar = Progress(label or "evaluation", len(examples), "examples", show=label is not None)
    try:
        with torch.no_grad(), bar:
            if encoder.kind == "classification":
                metrics, rows, sums = _classify(model, encoder, examples, batch_size, device, bar)
            else:
                metrics, rows, sums = _generate(
                    model, encoder, examples, batch_size, max_new_tokens, device, bar, synced,
                    loss_chunks,
                )
            bar.advance(len(examples))
    finally:
        model.train(was_training)
    return EvalResult(
        metrics=metrics,
        rows=rows,
        config=config,
        config_hash=config_hash_of(config),
        timings={"seconds": time.perf_counter() - start},
        sums=sums,
    )


def pad_id_of(tokenizer: Any) -> int:
    """pad, else EOS (Llama-style tokenizers have no pad), else 0: masked positions anyway.
    An image processor has neither (images are not padded): 0, never read."""
    for candidate in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if candidate is not None:
            return int(candidate)
    return 0


def _batch(seqs: list[list[int]], pad: int, left: bool, device: str) -> tuple[Any, Any]:
    """Pad a list of id lists into (input_ids, attention_mask) tensors."""
    import torch

    width = max(len(s) for s in seqs)
    ids, mask = [], []
    for s in seqs:
        fill = [pad] * (width - len(s))
        ids.append(fill + s if left else s + fill)
        ones, zeros = [1] * len(s), [0] * (width - len(s))
        mask.append(zeros + ones if left else ones + zeros)
    return (torch.tensor(ids, device=device), torch.tensor(mask, device=device))


def _classify(
    model: Any, encoder: Any, examples: list[Example], batch_size: int, device: str, bar: Progress
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, float]]:
    import torch

    n_model = getattr(getattr(model, "config", None), "num_labels", None)
    if n_model is not None and n_model != len(encoder.label_names):
        raise InputError(
            [
                Problem(
                    "model",
                    f"the classification head has {n_model} outputs but the data "
                    f"has {len(encoder.label_names)} classes",
                    "load the model with num_labels and id2label from data.labels (D6)",
                )
            ],
            title="label mapping mismatch",
        )
    pad = pad_id_of(encoder.tokenizer)
    rows: list[dict[str, Any]] = []
    loss_sum = 0.0
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        bar.advance(i)
        encoded = [encoder.encode(e) for e in chunk]
        inputs = model_inputs(collate(encoded, "classification", pad))  # as training builds it
        logits = model(**{k: v.to(device) for k, v in inputs.items()}).logits.float()
        gold = torch.tensor([e.labels[0] for e in encoded], device=logits.device)
        loss_sum += torch.nn.functional.cross_entropy(logits, gold, reduction="sum").item()
        preds = logits.argmax(dim=-1).tolist()
        for ex, enc, pred, row_logits in zip(chunk, encoded, preds, logits.tolist(), strict=True):
            rows.append(
                {
                    "id": ex.id,
                    "gold": ex.label,
                    "pred": encoder.id2label[pred],
                    "correct": encoder.id2label[pred] == ex.label,
                    "logits": row_logits,
                    "truncated": enc.truncated,
                }
            )
    sums = {"loss_sum": loss_sum, "loss_count": len(rows), "answers_cut": 0}
    return classification_summary(encoder, rows, sums), rows, sums


def classification_summary(
    encoder: Any, rows: list[dict[str, Any]], sums: dict[str, float]
) -> dict[str, Any]:
    """The classification metrics of `rows` (in the examples' order) and their loss sums."""
    metrics = classification_metrics(
        [r["gold"] for r in rows], [r["pred"] for r in rows], encoder.label_names
    )
    metrics["loss"] = sums["loss_sum"] / sums["loss_count"]
    metrics["answers_cut"] = 0  # a class id is never truncated
    return metrics


def _answer_loss(
    model: Any, encoded: list[Any], pad: int, device: str, chunks: int
) -> tuple[float, int]:
    """Summed next-token cross-entropy on the loss positions of a batch, and their count:
    the training loss's own chunks (`train.loss`), so no full fp32 logits of the batch."""
    import torch

    from tunepilot.train.loss import causal_lm_summed_loss

    ids, mask = _batch([e.input_ids for e in encoded], pad, left=False, device=device)
    width = ids.shape[1]
    labels = torch.tensor(
        [e.labels + [IGNORE_INDEX] * (width - len(e.labels)) for e in encoded], device=device
    )
    loss = causal_lm_summed_loss(model, {"input_ids": ids, "attention_mask": mask}, labels,
                                 chunks=chunks, use_cache=False)  # fmt: skip
    return loss.item(), int((labels[:, 1:] != IGNORE_INDEX).sum().item())


def _generate(
    model: Any,
    encoder: Any,
    examples: list[Example],
    batch_size: int,
    max_new_tokens: int,
    device: str,
    bar: Progress,
    synced: bool = False,
    loss_chunks: int = 8,
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, float]]:
    tokenizer = encoder.tokenizer
    pad, eos = pad_id_of(tokenizer), tokenizer.eos_token_id
    outputs: list[str] = []
    stopped: list[bool] = []
    n_tokens: list[int] = []
    loss_sum, loss_tokens, answers_cut = 0.0, 0, 0
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        bar.advance(i)
        encoded = [encoder.encode(e) for e in chunk]
        answers_cut += sum(e.target_truncated for e in encoded)
        s, n = _answer_loss(model, encoded, pad, device, loss_chunks)
        loss_sum, loss_tokens = loss_sum + s, loss_tokens + n
        prompts = [encoder.prompt_ids(e) for e in chunk]
        ids, mask = _batch(prompts, pad, left=True, device=device)
        generated = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=pad,
            eos_token_id=eos,
            **({"synced_gpus": True} if synced else {}),
        )
        for row in generated[:, ids.shape[1] :].tolist():
            cut = row.index(eos) if eos in row else len(row)
            stopped.append(cut < len(row))
            n_tokens.append(cut)
            outputs.append(tokenizer.decode(row[:cut], skip_special_tokens=True))
    sums = {"loss_sum": loss_sum, "loss_count": loss_tokens, "answers_cut": answers_cut}
    generated_rows = [{"output": o, "output_tokens": n, "stopped_at_eos": s}
                      for o, n, s in zip(outputs, n_tokens, stopped, strict=True)]  # fmt: skip
    metrics, rows = generation_summary(encoder, examples, generated_rows, sums)
    return metrics, rows, sums


def generation_summary(
    encoder: Any, examples: list[Example], generated: list[dict[str, Any]],
    sums: dict[str, float],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
    """Metrics and rows of generated outputs ({output, output_tokens, stopped_at_eos} per
    example, in the examples' order) and their loss sums: one process's or every rank's."""
    outputs = [g["output"] for g in generated]
    stopped = [g["stopped_at_eos"] for g in generated]
    n_tokens = [g["output_tokens"] for g in generated]
    ids_list = [e.id for e in examples]
    if encoder.task == "extraction":
        gold = [encoder.gold_object(e) for e in examples]
        scored = extraction_metrics(
            gold, outputs, encoder.required_fields, encoder.schema, ids=ids_list
        )
    else:
        gold = [encoder.answer_text(e) for e in examples]
        scored = format_metrics(gold, outputs, ids=ids_list,
                                json_answers=encoder.answers_are_json,
                                required_fields=encoder.required_fields, schema=encoder.schema)
    rows = []
    for g, out, stop, n, row in zip(gold, outputs, stopped, n_tokens, scored["rows"], strict=True):
        rows.append({**row, "gold": g, "output": out, "output_tokens": n, "stopped_at_eos": stop})
    metrics = scored["metrics"]
    metrics["loss"] = sums["loss_sum"] / sums["loss_count"] if sums["loss_count"] else math.nan
    metrics["stopped_at_eos"] = sum(stopped) / len(stopped)
    metrics["answers_cut"] = sums["answers_cut"]
    return metrics, rows
