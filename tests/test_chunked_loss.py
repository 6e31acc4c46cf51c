"""The causal-LM loss in chunks over the loss positions (S2, S3, D5): the same sums and
gradients as the full-logits loss, with LoRA on the head and tied embeddings, deterministic."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tunepilot.tasks.base import IGNORE_INDEX  # noqa: E402
from tunepilot.train.batching import count_targets, microbatch_loss, summed_loss  # noqa: E402
from tunepilot.train.loss import (  # noqa: E402
    causal_lm_summed_loss,
    chunked_head_loss,
    eval_chunks,
    loss_positions,
)

VOCAB = 97


def _model(tied: bool = False, lora_on_head: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
        max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    if lora_on_head:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8,
                                                 target_modules=["q_proj", "lm_head"]))
        for name, p in model.named_parameters():  # B starts at zero: move it so it counts
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)
    return model


def _batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # a padded row
    labels = ids.clone()
    labels[:, :4] = IGNORE_INDEX  # a prompt without loss
    labels[1, 8:] = IGNORE_INDEX
    labels[2, :9] = IGNORE_INDEX  # a short answer
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _full_logits(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   use_cache=False).logits  # fmt: skip
    return summed_loss(logits, batch["labels"], "causal_lm")


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("variant", ["untied", "tied", "lora_on_head"])
@pytest.mark.parametrize("chunks", [1, 3, 8, 1000])
def test_s2_chunked_loss_equals_full_logits_loss_at_every_chunk_count(variant, chunks) -> None:
    model = _model(tied=variant == "tied", lora_on_head=variant == "lora_on_head")
    batch = _batch()
    reference = _full_logits(model, batch)
    reference.backward()
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    got = microbatch_loss(model, batch, "causal_lm", chunks=chunks)
    got.backward()
    have = _grads(model)
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)
    assert set(have) == set(want) and want  # every trained tensor, the head's LoRA included
    for name in want:
        torch.testing.assert_close(have[name], want[name], rtol=1e-4, atol=1e-6)
    if variant == "lora_on_head":
        assert any("lm_head" in n and "lora" in n for n in have)


def test_s2_chunked_loss_sums_exactly_the_positions_count_targets_counts() -> None:
    batch = _batch()
    hidden = torch.randn(3, 11, 5)
    kept, targets = loss_positions(hidden, batch["labels"])
    assert kept.shape[0] == targets.shape[0] == count_targets(batch, "causal_lm")
    assert (targets != IGNORE_INDEX).all()


def test_s2_a_microbatch_without_targets_gives_zero_that_still_reaches_the_head() -> None:
    model = _model()
    batch = _batch()
    batch["labels"][:] = IGNORE_INDEX
    loss = microbatch_loss(model, batch, "causal_lm", chunks=4)
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert model.lm_head.weight.grad is not None


def test_s3_chunked_loss_on_cpu_is_bit_identical_across_two_runs() -> None:
    runs = []
    for _ in range(2):
        model = _model(lora_on_head=True)
        loss = microbatch_loss(model, _batch(), "causal_lm", chunks=3)
        loss.backward()
        runs.append((loss.detach().clone(), _grads(model)))
    assert torch.equal(runs[0][0], runs[1][0])
    assert all(torch.equal(runs[0][1][n], runs[1][1][n]) for n in runs[0][1])


def test_s2_no_vocabulary_wide_tensor_of_the_microbatch_is_kept_for_backward() -> None:
    """Saved for backward: the chunked loss keeps no (tokens x vocab) tensor at all."""
    model = _model()
    batch = _batch()
    widest = []

    def pack(t):
        weight = t.numel() == VOCAB * 32  # the head's own weight (hidden size 32)
        if t.dim() >= 2 and t.shape[-1] == VOCAB and t.numel() >= VOCAB * 13 and not weight:
            widest.append(tuple(t.shape))  # logits of every loss position (13) or more
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        microbatch_loss(model, batch, "causal_lm", chunks=4)
    assert widest == []
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _full_logits(model, batch)
    assert widest  # the check sees the full-logits loss's tensors


def test_s2_evaluation_chunks_keep_each_piece_a_training_chunk() -> None:
    assert eval_chunks(8, 2, 32) == 128
    assert eval_chunks(8, 4, 2) == 8
    # a large eval batch over short rows: no chunk finer than MIN_EVAL_CHUNK_POSITIONS (512)
    # of the positions the batch really has; with gradients, every chunk asked for
    calls = []
    head = torch.nn.Linear(4, 6)
    head.register_forward_hook(lambda _m, args, _out: calls.append(args[0].shape[0]))
    hidden, targets = torch.randn(512 * 128, 4), torch.randint(0, 6, (512 * 128,))
    with torch.no_grad():
        chunked_head_loss(head, hidden, targets, eval_chunks(8, 1, 512))
    assert len(calls) == 128 and min(calls) == 512
    calls.clear()
    with torch.no_grad():
        chunked_head_loss(head, hidden[:300], targets[:300], eval_chunks(8, 2, 32))
    assert calls == [300]
    calls.clear()
    chunked_head_loss(head, hidden[:300].requires_grad_(), targets[:300], 8)
    assert len(calls) == 8  # training keeps its chunks: each is recomputed in backward
    model = _model()
    batch = _batch()
    with torch.no_grad():
        full = _full_logits(model, batch)
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
        chunked = causal_lm_summed_loss(model, inputs, batch["labels"], chunks=5, use_cache=False)
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("value", ["0", "-3", "2.5", "eight"])
def test_s2_a_chunk_count_that_is_not_a_positive_integer_exits_2_naming_the_key(
    tmp_path, value
) -> None:
    import subprocess
    import sys

    from tunepilot.demo.campaign import write_demo_campaign

    path = write_demo_campaign(tmp_path, "extraction", tiny=True, n_conversations=40)
    done = subprocess.run([sys.executable, "-m", "tunepilot.cli", "validate", str(path),
                           f"training.loss_chunks={value}"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "training.loss_chunks" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr


def test_s2_a_loss_kernel_selected_but_absent_exits_2_naming_the_key_and_the_fix() -> None:
    import importlib.util

    from tunepilot.errors import InputError
    from tunepilot.train.loss import check_kernel, kernel_that_runs
    from tunepilot.train.runtime import runtime_record

    if importlib.util.find_spec("liger_kernel") is not None:
        pytest.skip("liger-kernel is installed here")
    with pytest.raises(InputError) as raised:
        check_kernel("liger")
    problem = raised.value.problems[0]
    assert problem.where == "training.loss_kernel"
    assert "pip install liger-kernel" in problem.fix and "plain" in problem.fix
    check_kernel("plain")  # always there
    assert kernel_that_runs("plain", "cuda") == "plain"
    from tunepilot.campaign.schema import TrainingSettings

    record = runtime_record(TrainingSettings(loss_chunks=3), "cpu")
    assert record["loss"] == {"kernel": "plain", "chunks": 3}  # what env.json records


def test_s2_a_soft_capped_head_gemma2_gives_the_full_logits_loss_in_chunks() -> None:
    torch.manual_seed(0)
    config = transformers.Gemma2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        final_logit_softcapping=0.02, attn_implementation="eager",
    )  # fmt: skip
    model = transformers.Gemma2ForCausalLM(config)
    batch = _batch()
    reference = _full_logits(model, batch)  # the model's own capped logits
    got = microbatch_loss(model, batch, "causal_lm", chunks=3)
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)
    uncapped = summed_loss(model.lm_head(model.model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
    ).last_hidden_state), batch["labels"], "causal_lm")  # fmt: skip
    assert abs(float(uncapped.detach()) - float(reference.detach())) > 0.1  # the cap matters


def test_s2_a_model_that_changes_its_logits_after_the_head_is_refused_not_trained_wrong() -> None:
    model = _model()

    def doubled(_module, _args, out):
        out.logits = out.logits * 2
        return out

    model.register_forward_hook(doubled)
    with pytest.raises(ValueError, match="does not reproduce the model's logits"):
        microbatch_loss(model, _batch(), "causal_lm", chunks=2)


def test_s3_a_lora_dropout_on_the_head_is_replayed_in_the_recompute() -> None:
    """Dropout on the head's adapter: the gradient of the chunked loss is that of the loss it
    returned (the recompute draws the same mask), checked against autograd on the same mask."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(_model(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5,
                                                target_modules=["lm_head"]))  # fmt: skip
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    batch = _batch()
    torch.manual_seed(5)
    got = microbatch_loss(model, batch, "causal_lm", chunks=1)
    got.backward()
    have = _grads(model)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)  # the same draws, without recompute: chunks=1 under plain autograd
    from tunepilot.train import loss as lossmod

    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    with lossmod.captured_hidden(model) as box:
        model(**inputs, use_cache=False)
    hidden, targets = lossmod.loss_positions(box["hidden"], batch["labels"])
    want_loss = lossmod._chunk_sum(lossmod.output_head(model), hidden, targets)
    want_loss.backward()
    torch.testing.assert_close(got, want_loss)
    for name, grad in _grads(model).items():
        torch.testing.assert_close(have[name], grad)


@pytest.mark.parametrize("kernel", ["liger", "cut_cross_entropy"])
def test_s2_a_kernel_library_gives_the_plain_chunked_loss_on_cuda(kernel) -> None:
    """On CUDA, with the library installed: the fused kernel's sum and gradients against the
    plain chunked loss on the same inputs (bf16 compute: bf16 tolerance)."""
    import importlib.util

    from tunepilot.train.loss import KERNEL_MODULES

    if not torch.cuda.is_available() or importlib.util.find_spec(KERNEL_MODULES[kernel]) is None:
        pytest.skip(f"needs CUDA and {KERNEL_MODULES[kernel]}")
    results = []
    for name in ("plain", kernel):
        model = _model().to("cuda", torch.bfloat16)
        batch = {k: v.to("cuda") for k, v in _batch().items()}
        loss = microbatch_loss(model, batch, "causal_lm", chunks=3, kernel=name)
        loss.backward()
        results.append((loss.detach().float(), model.lm_head.weight.grad.float()))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=5e-2, atol=5e-3)
