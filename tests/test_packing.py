"""S2, D5, R1, B3: packed microbatches (data.packing) train the same examples as padded ones.

A packed row holds several examples; nothing may cross between them: positions restart, the
block-diagonal causal mask keeps attention inside each example, and the first label of each
example is ignored. The proofs run a real tiny Llama in fp32 on the CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from campaign_support import prompt_masked, tiny_lm_examples
from tunepilot.campaign import TrainingSettings
from tunepilot.tasks.base import IGNORE_INDEX, Encoded
from tunepilot.train.packing import Packing, pack_rows, row_spans

torch = pytest.importorskip("torch")
from tunepilot.train.batching import (  # noqa: E402  (after the torch skip)
    UpdateSampler,
    collate,
    count_targets,
    model_inputs,
)


def example(i: int, ids: list[int], prompt: int = 2) -> Encoded:
    return prompt_masked(i, ids, prompt)


@pytest.fixture(scope="module")
def data(tiny_llama_dir: Path) -> tuple[list[Encoded], int]:
    """24 causal-LM examples of 4 to 40 tokens, the first tokens of each masked."""
    return tiny_lm_examples(tiny_llama_dir, 24, lambda i: 3 + (i * 7) % 37, lambda i: 1 + i % 3)


def llama(path: Path, attention: str = "sdpa"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation=attention)
    return model.eval()  # no dropout: the same function packed or alone


# ---------------------------------------------------------------------------------------------
# the layout
# ---------------------------------------------------------------------------------------------


def test_s2_pack_rows_fits_every_row_and_is_a_pure_function_of_the_lengths() -> None:
    lengths = [30, 5, 17, 64, 2, 40, 9, 33]
    rows = pack_rows(lengths, 64)
    assert sorted(i for row in rows for i in row) == list(range(8))  # each example once
    assert all(sum(lengths[i] for i in row) <= 64 for row in rows)
    assert len(rows) == 4  # 200 tokens need at least ceil(200 / 64) = 4 rows
    assert pack_rows(lengths, 64) == rows  # no hidden state, no RNG
    assert pack_rows([64] * 3, 64) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="longer than a packed row"):
        pack_rows([65], 64)


def test_d5_packed_labels_ignore_each_example_start_and_count_the_unpacked_targets() -> None:
    a, b, c = example(0, [5, 6, 7, 8]), example(1, [9, 10, 11]), example(2, [12, 13, 14, 15, 16])
    packed = collate([a, b, c], "causal_lm", 0, Packing(8))
    padded = collate([a, b, c], "causal_lm", 0)
    assert count_targets(packed, "causal_lm") == count_targets(padded, "causal_lm") == 6  # S2
    spans = row_spans([a, b, c], Packing(8))
    for r, row in enumerate(spans):
        for _, start, end in row:
            assert packed["labels"][r, start] == IGNORE_INDEX  # never predicted across examples
            assert packed["position_ids"][r, start:end].tolist() == list(range(end - start))
    mask = packed["attention_mask"]
    assert spans == [[(0, 0, 4), (1, 4, 7)], [(2, 0, 5)]]  # loads 7 and 5: balanced, width 7
    assert mask.shape == (2, 1, 7, 7) and mask.dtype == torch.bool
    (row, first, second), = [(r, s[0], s[1]) for r, s in enumerate(spans) if len(s) == 2]
    assert not mask[row, 0, second[1], first[1]]  # the second example never sees the first
    assert mask[row, 0, second[1] + 1, second[1]]  # but sees its own earlier tokens


def test_d5_flash_attention_gets_one_flattened_row_without_mask_or_padding() -> None:
    """Mocked: a stand-in object whose config says flash_attention_2 (no CUDA here)."""

    class Config:
        _attn_implementation = "flash_attention_2"

    class FlashModel:
        config = Config()

    packing = Packing(8).for_model(FlashModel())
    a, b, c = example(0, [5, 6, 7, 8]), example(1, [9, 10, 11]), example(2, [12, 13, 14, 15, 16])
    batch = collate([a, b, c], "causal_lm", 0, packing)
    assert set(batch) == {"input_ids", "position_ids", "labels"}
    assert batch["input_ids"].shape == (1, 12)  # 4 + 3 + 5 tokens, no padding
    assert (batch["position_ids"][0] == 0).sum() == 3  # the boundaries the varlen kernel reads
    assert count_targets(batch, "causal_lm") == 6


# ---------------------------------------------------------------------------------------------
# the proofs on a real model
# ---------------------------------------------------------------------------------------------


def _per_example_losses(model, batch, spans) -> list[torch.Tensor]:
    """Each example's summed loss in a packed microbatch, read from its own positions."""
    logits = model(**model_inputs(batch), use_cache=False).logits.float()
    labels = batch["labels"]
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX, reduction="none",
    ).view(labels.shape[0], -1)  # fmt: skip
    return [ce[r, start : end - 1].sum() for r, row in enumerate(spans) for _, start, end in row]


def _alone_loss(model, e: Encoded) -> torch.Tensor:
    batch = collate([e], "causal_lm", 0)
    logits = model(**model_inputs(batch), use_cache=False).logits.float()
    return torch.nn.functional.cross_entropy(
        logits[0, :-1], batch["labels"][0, 1:], ignore_index=IGNORE_INDEX, reduction="sum"
    )


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_s2_an_example_has_the_same_loss_and_gradient_packed_with_others_or_alone(
    tiny_llama_dir, data, attention
) -> None:
    examples = data[0][:8]
    model = llama(tiny_llama_dir, attention)
    packing = Packing(64).for_model(model)
    batch = collate(examples, "causal_lm", data[1], packing)
    spans = row_spans(examples, packing)
    assert batch["input_ids"].shape[0] < len(examples)  # really packed: rows hold several
    order = [i for row in spans for i, _, _ in row]
    packed = _per_example_losses(model, batch, spans)
    for i, loss in zip(order, packed, strict=True):
        torch.testing.assert_close(loss, _alone_loss(model, examples[i]), rtol=1e-5, atol=1e-5)
    # The gradient of one example (the one packed second in its row), packed and alone.
    k = next(n for n, (row, pos) in enumerate((r, p) for r in spans for p in range(len(r)))
             if pos == 1)  # fmt: skip
    weight = model.model.layers[0].self_attn.q_proj.weight
    (g_packed,) = torch.autograd.grad(packed[k], weight)
    fresh = _per_example_losses(model, batch, spans)[k]  # same graph again, for its gradient
    (g_again,) = torch.autograd.grad(fresh, weight)
    (g_alone,) = torch.autograd.grad(_alone_loss(model, examples[order[k]]), weight)
    torch.testing.assert_close(g_packed, g_again, rtol=0, atol=0)
    torch.testing.assert_close(g_packed, g_alone, rtol=1e-4, atol=1e-6)


def test_s2_the_flattened_layout_gives_each_example_its_alone_loss(tiny_llama_dir, data) -> None:
    """The exact tensors flash attention gets (one row, restarting positions, no mask), run
    through SDPA, where transformers builds the block mask from the position ids: the layout
    is right; only the CUDA kernel that reads it is not run here."""
    examples = data[0][:6]
    model = llama(tiny_llama_dir)
    packing = Packing(64, attention="flash")
    batch = collate(examples, "causal_lm", data[1], packing)
    spans = row_spans(examples, packing)
    assert batch["input_ids"].shape[0] == 1 and "attention_mask" not in batch
    for (i, _, _), loss in zip(spans[0], _per_example_losses(model, batch, spans), strict=True):
        torch.testing.assert_close(loss, _alone_loss(model, examples[i]), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------


def _train(tiny_llama_dir, data, run_dir, packing, **kw):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tunepilot.train.loop import train

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj"]))  # fmt: skip
    s = TrainingSettings(microbatch=4, accumulation=2, budget={"updates": 6}, lr=5e-3, seed=3,
                         checkpoint_every=3, keep_last_checkpoints=3)  # fmt: skip
    result = train(model, data[0], s, run_dir, kind="causal_lm", pad_id=data[1],
                   progress=False, packing=packing, **kw)  # fmt: skip
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return result, lines


def test_s2_a_packed_run_follows_the_padded_runs_curve_at_equal_examples_per_update(
    tiny_llama_dir, data, tmp_path
) -> None:
    _, padded = _train(tiny_llama_dir, data, tmp_path / "padded", None)
    _, packed = _train(tiny_llama_dir, data, tmp_path / "packed", Packing(64))
    assert [x["examples"] for x in packed] == [x["examples"] for x in padded]
    assert [x["loss_tokens"] for x in packed] == [x["loss_tokens"] for x in padded]  # S2
    for a, b in zip(packed, padded, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)


def test_r1_a_packed_run_is_bit_identical_again_and_after_resume(
    tiny_llama_dir, data, tmp_path
) -> None:
    _, whole = _train(tiny_llama_dir, data, tmp_path / "a", Packing(64))
    _, again = _train(tiny_llama_dir, data, tmp_path / "b", Packing(64))
    assert [x["loss"] for x in again] == [x["loss"] for x in whole]  # exact
    paused, _ = _train(tiny_llama_dir, data, tmp_path / "c", Packing(64), stop_after=3)
    assert paused.status == "paused" and paused.updates == 3
    done, resumed = _train(tiny_llama_dir, data, tmp_path / "c", Packing(64),
                           resume=tmp_path / "c")  # fmt: skip
    assert done.updates == 6
    assert [x["loss"] for x in resumed] == [x["loss"] for x in whole]  # exact


def test_r1_a_packed_checkpoint_is_not_resumed_padded(tiny_llama_dir, data, tmp_path) -> None:
    from tunepilot.errors import InputError

    _train(tiny_llama_dir, data, tmp_path / "c", Packing(64), stop_after=3)
    with pytest.raises(InputError, match="packing"):
        _train(tiny_llama_dir, data, tmp_path / "c", None, resume=tmp_path / "c")


def test_b3_packing_keeps_the_examples_of_an_update_whatever_the_world_size(data) -> None:
    lengths = [len(e.input_ids) for e in data[0]]
    one = UpdateSampler(lengths, 2, 4, seed=5, bucket_by_length=True)
    ranks = [UpdateSampler(lengths, 2, 2, seed=5, bucket_by_length=True, rank=r, world_size=2)
             for r in range(2)]  # fmt: skip

    def packed_ids(microbatches: list[list[int]]) -> list[str]:
        out = []
        for mb in microbatches:
            chosen = [data[0][i] for i in mb]
            out += [chosen[i].example_id for row in row_spans(chosen, Packing(64))
                    for i, _, _ in row]  # fmt: skip
        return sorted(out)

    for _ in range(3):
        whole = packed_ids(one.next_update().microbatches)
        split = packed_ids([mb for s in ranks for mb in s.next_update().microbatches])
        assert whole == split
