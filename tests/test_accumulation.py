"""S2: one update built from microbatches has the gradient of the update's mean loss.

Sequences have different lengths and different prompt masks, so a per-microbatch mean would
weight tokens unequally; the loop's token-weighted normalisation must not. float64 makes the
comparison exact up to summation order (1e-6 is far above that noise and far below the error
of the naive normalisation, which the last test shows).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tunepilot.campaign import TrainingSettings
from tunepilot.model.tiny import DEFAULT_CORPUS
from tunepilot.tasks.base import IGNORE_INDEX, Encoded
from tunepilot.train.batching import UpdateSampler, collate, count_targets, summed_loss
from tunepilot.train.loop import backward_update, train

torch = pytest.importorskip("torch")


def lm_examples(tokenizer_dir: Path, n: int) -> tuple[list[Encoded], int]:
    """n examples of lengths from a few to ~100 tokens, each with a different prompt mask."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    out = []
    for i in range(n):
        text = " ".join(DEFAULT_CORPUS[(i + k) % len(DEFAULT_CORPUS)] for k in range(1 + i % 4))
        ids = tok(text)["input_ids"][: 4 + (i * 7) % 100] + [tok.eos_token_id]
        prompt = min(len(ids) - 2, i % 5)
        labels = [IGNORE_INDEX] * prompt + ids[prompt:]
        out.append(Encoded(f"ex{i}", ids, labels, prompt, False, False, len(ids)))
    return out, tok.pad_token_id


def cls_examples(tokenizer_dir: Path, n: int) -> tuple[list[Encoded], int]:
    lm, pad = lm_examples(tokenizer_dir, n)
    return [Encoded(e.example_id, e.input_ids, [i % 3], 0, False, False, e.full_length)
            for i, e in enumerate(lm)], pad  # fmt: skip


def tiny_llama(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(str(path)).double()


def tiny_bert_classifier(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(path), num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    return model.double()


def grads_for(model, data, pad_id, kind, groups: list[list[int]]) -> dict[str, torch.Tensor]:
    """Gradients of one update made of the microbatches `groups` (indices into data)."""
    model.zero_grad(set_to_none=True)
    batches = [collate([data[i] for i in g], kind, pad_id) for g in groups]
    targets = sum(count_targets(b, kind) for b in batches)
    backward_update(model, batches, kind, targets)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and len(a) > 10
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-6, msg=name)


def test_s2_causal_lm_accumulation_8x2_equals_1x16_on_uneven_lengths(tiny_llama_dir: Path) -> None:
    data, pad = lm_examples(tiny_llama_dir, 16)
    assert len({len(e.input_ids) for e in data}) > 8  # really different lengths
    model = tiny_llama(tiny_llama_dir)
    accumulated = grads_for(model, data, pad, "causal_lm", [[2 * k, 2 * k + 1] for k in range(8)])
    whole = grads_for(model, data, pad, "causal_lm", [list(range(16))])
    assert_same_grads(accumulated, whole)


def test_s2_classification_accumulation_8x2_equals_1x16(tiny_bert_dir: Path) -> None:
    data, pad = cls_examples(tiny_bert_dir, 16)
    model = tiny_bert_classifier(tiny_bert_dir)
    accumulated = grads_for(
        model, data, pad, "classification", [[2 * k, 2 * k + 1] for k in range(8)]
    )
    whole = grads_for(model, data, pad, "classification", [list(range(16))])
    assert_same_grads(accumulated, whole)


def test_s2_a_final_partial_update_of_13_examples_is_normalised_by_its_own_count(
    tiny_llama_dir: Path,
) -> None:
    data, pad = lm_examples(tiny_llama_dir, 13)
    sampler = UpdateSampler([len(e.input_ids) for e in data], 2, 8, seed=0)
    update = sampler.next_update()
    assert update.update_examples == 13 and [len(m) for m in update.microbatches][-1] == 1
    model = tiny_llama(tiny_llama_dir)
    accumulated = grads_for(model, data, pad, "causal_lm", update.microbatches)
    whole = grads_for(model, data, pad, "causal_lm", [list(range(13))])
    assert_same_grads(accumulated, whole)


def test_s2_the_naive_per_microbatch_mean_would_differ(tiny_llama_dir: Path) -> None:
    """The tolerance above is discriminating: the common shortcut misses it by far."""
    data, pad = lm_examples(tiny_llama_dir, 16)
    model = tiny_llama(tiny_llama_dir)
    whole = grads_for(model, data, pad, "causal_lm", [list(range(16))])
    model.zero_grad(set_to_none=True)
    for k in range(8):
        batch = collate(data[2 * k : 2 * k + 2], "causal_lm", pad)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        mean = summed_loss(logits, batch["labels"], "causal_lm") / count_targets(batch, "causal_lm")
        (mean / 8).backward()
    worst = max(
        float((p.grad - whole[n]).abs().max())
        for n, p in model.named_parameters()
        if p.grad is not None
    )
    assert worst > 1e-4


def test_s2_loop_curves_match_for_8x2_and_1x16_including_the_partial_update(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """Through `train`: 40 examples -> updates of 16, 16 and a partial 8, twice."""
    data, pad = lm_examples(tiny_llama_dir, 40)
    curves, weights = [], []
    for name, (mb, acc) in {"8x2": (2, 8), "1x16": (16, 1)}.items():
        settings = TrainingSettings(
            microbatch=mb, accumulation=acc, budget={"updates": 6}, lr=1e-3,
            bucket_by_length=False, scheduler="cosine", warmup_updates=2,
        )  # fmt: skip
        model = tiny_llama(tiny_llama_dir)
        seen: list[dict] = []
        result = train(model, data, settings, tmp_path / name, kind="causal_lm", pad_id=pad,
                       on_update=seen.append, progress=False)  # fmt: skip
        assert result.status == "completed" and result.updates == 6
        assert [r["examples"] for r in seen] == [16, 16, 8, 16, 16, 8]
        curves.append(torch.tensor([r["loss"] for r in seen], dtype=torch.float64))
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(curves[0], curves[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(weights[0], weights[1], rtol=1e-6, atol=1e-6)
