"""The evaluation procedure across data-parallel ranks (V2, B3, B4): every rank evaluates its
share of the examples and every rank ends with the one-process result.

Without it, DDP's rank 0 evaluated alone while the other ranks waited in their next
collective (whose default timeout is 30 minutes: a long validation pass killed the run), and
FSDP's ranks each evaluated the whole split. Here rank r takes examples r, r + N, r + 2N ...
of the split, runs the one procedure (`evaluate.evaluate`) on them, and the ranks exchange
their rows and loss sums as JSON (`distributed.all_gather_text`: no pickle). The union is put
back in the split's order and summarised by the same functions one process uses
(`classification_summary`, `generation_summary`), under the same `eval_config` hash: the
metrics are those of one process, to the float summation order of the loss (batches are
formed differently) and, rarely, a greedy token where two logits tie to the last bit.

Under FSDP every forward is a collective, so the ranks must run the same forwards: a rank
whose share has one batch fewer evaluates one throw-away batch, and generation runs with
transformers' `synced_gpus`, which keeps stepping until every rank's batch has finished.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tunepilot.experiments.evaluate import (
    EvalResult,
    classification_summary,
    config_hash_of,
    eval_config,
    evaluate,
    generation_summary,
)


def evaluate_sharded(
    model: Any, encoder: Any, examples: list[Any], batch_size: int, max_new_tokens: int,
    device: str, *, rank: int, world_size: int, lockstep: bool, label: str | None = None,
    loss_chunks: int = 8,
) -> EvalResult:  # fmt: skip
    """`evaluate.evaluate` of `examples`, shared over `world_size` ranks; every rank returns
    the whole result. `lockstep`: the model's forwards are collectives (FSDP)."""
    from tunepilot.train.distributed import all_gather_text

    mine = list(range(rank, len(examples), world_size))
    part: EvalResult | None = None
    if mine:
        part = evaluate(model, encoder, [examples[i] for i in mine], batch_size, max_new_tokens,
                        device, label=label, synced=lockstep,
                        loss_chunks=loss_chunks)  # fmt: skip
    if lockstep:
        most = math.ceil(len(examples) / world_size)
        for _ in range(_batches(most, batch_size) - _batches(len(mine), batch_size)):
            evaluate(model, encoder, examples[:1], batch_size, max_new_tokens, device,
                     synced=True, loss_chunks=loss_chunks)  # a throw-away batch for the others
    payload = json.dumps({"index": mine, "rows": part.rows if part else [],
                          "sums": part.sums if part else {}, "seconds": part.timings.get(
                              "seconds", 0.0) if part else 0.0})  # fmt: skip
    shares = [json.loads(text) for text in all_gather_text(payload, world_size)]
    order = sorted((i, row) for share in shares for i, row in zip(share["index"], share["rows"],
                                                                  strict=True))  # fmt: skip
    rows = [row for _, row in order]
    sums = {k: sum(share["sums"].get(k, 0) for share in shares)
            for k in ("loss_sum", "loss_count", "answers_cut")}  # fmt: skip
    if encoder.kind == "classification":
        metrics = classification_summary(encoder, rows, sums)
    else:
        generated = [{k: r[k] for k in ("output", "output_tokens", "stopped_at_eos")} for r in rows]
        metrics, rows = generation_summary(encoder, examples, generated, sums)
    config = eval_config(encoder, examples, batch_size, max_new_tokens)
    seconds = max(share["seconds"] for share in shares)
    return EvalResult(metrics, rows, config, config_hash_of(config),
                      {"seconds": seconds, "ranks": world_size}, sums)  # fmt: skip


def evaluate_on_ranks(
    model: Any, encoder: Any, examples: list[Any], batch_size: int, max_new_tokens: int,
    device: str, label: str | None, ranks: tuple[int, int, bool] | None, loss_chunks: int = 8,
) -> EvalResult:  # fmt: skip
    """The one procedure in one process, or shared when `ranks` (rank, world size, forwards
    are collectives) holds more than one rank."""
    if ranks is None or ranks[1] == 1:
        return evaluate(model, encoder, examples, batch_size, max_new_tokens, device, label,
                        loss_chunks=loss_chunks)  # fmt: skip
    return evaluate_sharded(model, encoder, examples, batch_size, max_new_tokens, device,
                            rank=ranks[0], world_size=ranks[1], lockstep=ranks[2],
                            label=label, loss_chunks=loss_chunks)  # fmt: skip


def _batches(n: int, batch_size: int) -> int:
    return math.ceil(n / batch_size)
