"""Peak tensor bytes of one training step: tunepilot's vs TRL's `SFTTrainer`, same model and data.

    .venv/bin/python benchmarks/bench_step_memory_vs_trl.py [--rows 2] [--length 2048]

The model is a Llama built from config that is tiny but as wide as Llama 3 where it matters
for this step: a 128,256-token vocabulary, a small hidden size (so it runs on a CPU), two
blocks, LoRA r 8 on q and v (the same adapter on both sides, same seed). The data is 2 rows of
2048 random token ids whose first half is the prompt: loss on the answer only (TRL's
`completion_mask`, tunepilot's IGNORE_INDEX labels). One step is forward, backward and the
optimizer step of each tool's own code: tunepilot's `backward_update` (the loop's, with the
chunked loss of `train.loss`) and AdamW; TRL's `SFTTrainer.training_step` on a batch from its
own collator, then its optimizer. Peak tensor bytes above the step's start come from the
PyTorch profiler's allocation events (`MemoryProbe(tensors=True)`), never RSS. The two steps
run interleaved (tunepilot, TRL, tunepilot, TRL) and each figure is the smaller of its two.
Goal: tunepilot <= 0.5x TRL. Needs `trl` (exits 0 saying so when absent).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path

VOCAB, HIDDEN, LAYERS = 128_256, 256, 2
GIB = 2**30


def _model():
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN,
                         num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=8192, tie_word_embeddings=False)  # fmt: skip
    base = LlamaForCausalLM(config)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                      task_type="CAUSAL_LM")  # fmt: skip
    return get_peft_model(base, lora)


def _rows(rows: int, length: int) -> tuple[list[list[int]], list[list[int]]]:
    import random

    rng = random.Random(0)
    ids = [[rng.randrange(VOCAB) for _ in range(length)] for _ in range(rows)]
    completion = [[0] * (length // 2) + [1] * (length - length // 2) for _ in range(rows)]
    return ids, completion


def _peak(step) -> int:  # type: ignore[no-untyped-def]
    from tunepilot.measure.memory import MemoryProbe

    gc.collect()
    probe = MemoryProbe.for_device("cpu", tensors=True)
    with probe.phase("step") as record:
        step()
    peak = record.peak_delta_bytes("tensors")
    if peak is None:
        raise SystemExit("the profiler gave no tensor bytes on this torch build")
    return int(peak)


def tunepilot_step(rows: int, length: int):  # type: ignore[no-untyped-def]
    import torch

    from tunepilot.tasks.base import IGNORE_INDEX
    from tunepilot.train.batching import backward_update, count_targets

    model = _model()
    model.train()
    ids, completion = _rows(rows, length)
    input_ids = torch.tensor(ids)
    labels = torch.where(torch.tensor(completion) == 1, input_ids, IGNORE_INDEX)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
             "labels": labels}  # fmt: skip
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step() -> None:
        backward_update(model, [batch], "causal_lm", count_targets(batch, "causal_lm"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def trl_step(rows: int, length: int, folder: Path):  # type: ignore[no-untyped-def]
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from tunepilot.model.tiny import build_tiny_llama

    from transformers import AutoTokenizer  # isort: skip

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_llama(folder / "tok"))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    ids, completion = _rows(rows, length)
    data = Dataset.from_dict({"input_ids": ids, "completion_mask": completion})
    args = SFTConfig(output_dir=str(folder / "trl"), per_device_train_batch_size=rows,
                     max_length=length, report_to=[], use_cpu=True, learning_rate=1e-4,
                     completion_only_loss=True, save_strategy="no", logging_steps=1000,
                     dataloader_num_workers=0, bf16=False, fp16=False)  # fmt: skip
    trainer = SFTTrainer(model=_model(), args=args, train_dataset=data,
                         processing_class=tokenizer)  # fmt: skip
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # what `train()` sets before each step
    model = trainer.model
    model.train()
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(rows)])
    assert int((batch["labels"] != -100).sum()) == rows * (length - length // 2)  # answer only

    def step() -> None:
        trainer.training_step(model, dict(batch))
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--length", type=int, default=2048)
    args = parser.parse_args()
    try:
        import trl
    except ImportError:
        print("trl is not installed: pip install trl (with torch pinned) to run this benchmark")
        return
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = tunepilot_step(args.rows, args.length), trl_step(args.rows, args.length,
                                                                         Path(tmp))  # fmt: skip
        peaks: dict[str, list[int]] = {"tunepilot": [], "trl": []}
        for _ in range(2):  # interleaved
            peaks["tunepilot"].append(_peak(ours))
            peaks["trl"].append(_peak(theirs))
    a, b = min(peaks["tunepilot"]), min(peaks["trl"])
    print(f"one training step, {args.rows} x {args.length} tokens, vocab {VOCAB:,}, hidden "
          f"{HIDDEN}, {LAYERS} blocks, LoRA r 8 q,v, fp32 on CPU, loss on the answer only "
          f"(half of each row); trl {trl.__version__}, torch {torch.__version__}")
    print("peak tensor bytes above the step's start (torch profiler allocation events):")
    print(f"  tunepilot (backward_update, chunked loss): {a / GIB:.2f} GiB "
          f"(runs {peaks['tunepilot']})")
    print(f"  TRL SFTTrainer.training_step:              {b / GIB:.2f} GiB (runs {peaks['trl']})")
    print(f"  ratio tunepilot / TRL: {a / b:.2f}x (goal <= 0.50x)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
