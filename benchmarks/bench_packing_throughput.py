"""Tokens per second on the CPU, same work, one thread each: tunepilot's loop with packed
microbatches (data.packing) vs its own length-bucketed padded microbatches vs TRL's
`SFTTrainer` with packing (its default best-fit-decreasing packing, padding-free).

    PYTHONPATH=src .venv/bin/python benchmarks/bench_packing_throughput.py [--repeats 2]

The work: a small Llama built from config (vocab 32,000, hidden 256, 4 layers; no weights
downloaded), LoRA r=8 on q_proj and v_proj, 8 x 2 per update (microbatch 8, accumulation 2;
for TRL 8 packed rows per device batch, 2 accumulation steps, as its users set it), one epoch
over the same 160 examples of 24 to 320 tokens whose first 40% (the prompt) carries no loss,
packed rows of 512 tokens, lr 1e-4, fp32. Throughput is the examples' real tokens (padding
never counted) over the wall time of the training call (tunepilot's `train`, TRL's
`trainer.train()`; dataset preparation outside for TRL, inside `train` for tunepilot, whose
collate packs on the fly). The three runs are interleaved, `--repeats` times, and the median
of each is reported, so load on the machine hits them alike.

Goals: tunepilot packed >= 1.8x TRL packing; tunepilot packed >= 1.0x tunepilot bucketed.
Needs `trl` (and `datasets`); says so and exits 0 without them.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

VOCAB, HIDDEN, LAYERS, HEADS, INTERMEDIATE = 32_000, 256, 4, 4, 688
N_EXAMPLES, SHORTEST, LONGEST, ROW = 160, 24, 320, 512
MICROBATCH, ACCUMULATION, LR, SEED = 8, 2, 1e-4, 0


def examples() -> list[tuple[list[int], int]]:
    """(token ids, prompt length): random ids below the vocabulary, lengths spread evenly."""
    rng = random.Random(SEED)
    out = []
    for _ in range(N_EXAMPLES):
        n = rng.randint(SHORTEST, LONGEST)
        out.append(([rng.randrange(3, VOCAB) for _ in range(n)], int(0.4 * n)))
    return out


def model():
    """The same initial model for every run: LoRA on a Llama built from config."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=HEADS,
                         intermediate_size=INTERMEDIATE, max_position_embeddings=ROW,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(SEED)
    base = LlamaForCausalLM(config)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                      task_type="CAUSAL_LM")  # fmt: skip
    return get_peft_model(base, lora)


def tunepilot(data: list[tuple[list[int], int]], packed: bool, folder: Path) -> float:
    """Seconds for one epoch through tunepilot's loop."""
    from tunepilot.campaign import TrainingSettings
    from tunepilot.tasks.base import IGNORE_INDEX, Encoded
    from tunepilot.train.loop import train
    from tunepilot.train.packing import Packing

    encoded = [Encoded(f"ex{i}", ids, [IGNORE_INDEX] * p + ids[p:], p, False, False, len(ids))
               for i, (ids, p) in enumerate(data)]  # fmt: skip
    updates = -(-len(data) // (MICROBATCH * ACCUMULATION))  # one epoch, the last partial
    settings = TrainingSettings(microbatch=MICROBATCH, accumulation=ACCUMULATION,
                                budget={"updates": updates}, lr=LR, scheduler="constant",
                                bucket_by_length=True, max_grad_norm=None, seed=SEED,
                                checkpoint_every=10**6, precision="fp32")  # fmt: skip
    m = model()
    start = time.perf_counter()
    result = train(m, encoded, settings, folder, kind="causal_lm", pad_id=0, progress=False,
                   packing=Packing(ROW) if packed else None)  # fmt: skip
    seconds = time.perf_counter() - start
    assert result.status == "completed", result.reason
    return seconds


def trl_run(data: list[tuple[list[int], int]], folder: Path) -> float:
    """Seconds for one epoch through TRL's SFTTrainer, packing on (bfd, padding-free)."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    rows = {"input_ids": [ids for ids, _ in data],
            "completion_mask": [[0] * p + [1] * (len(ids) - p) for ids, p in data]}  # fmt: skip
    config = SFTConfig(
        output_dir=str(folder), per_device_train_batch_size=MICROBATCH,
        gradient_accumulation_steps=ACCUMULATION, num_train_epochs=1, learning_rate=LR,
        lr_scheduler_type="constant", max_grad_norm=0.0, packing=True, max_length=ROW,
        completion_only_loss=True, save_strategy="no", report_to=[], logging_steps=10**6,
        use_cpu=True, dataloader_num_workers=0, seed=SEED, disable_tqdm=True,
        # SFTConfig turns activation checkpointing on by default (TRL 1.x); tunepilot's runs
        # here recompute nothing, so neither does TRL's: the same work on both sides.
        gradient_checkpointing=False,
    )  # fmt: skip
    trainer = SFTTrainer(model=model(), args=config, train_dataset=Dataset.from_dict(rows),
                         processing_class=_tokenizer(folder))  # fmt: skip
    start = time.perf_counter()
    trainer.train()
    return time.perf_counter() - start


def _tokenizer(folder: Path):
    """A real tokenizer for SFTTrainer's checks (pad and EOS at 0 and 2, as in the model's
    config); the data is already token ids, so it never encodes anything."""
    from tunepilot.model.tiny import train_tokenizer

    return train_tokenizer(folder / "tokenizer")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--examples", type=int, default=N_EXAMPLES, help="fewer: a smoke run")
    args = parser.parse_args()
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError as exc:
        print(f"skipped: {exc.name} is not installed (pip install trl)")
        return 0
    import torch

    from tunepilot.model.processors import quiet_transformers

    torch.set_num_threads(1)
    data = examples()[: args.examples]
    tokens = sum(len(ids) for ids, _ in data)
    times: dict[str, list[float]] = {"tunepilot packed": [], "tunepilot bucketed": [],
                                     "TRL SFTTrainer packing": []}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, quiet_transformers():
        for r in range(args.repeats):
            root = Path(tmp) / str(r)
            times["tunepilot packed"].append(tunepilot(data, True, root / "packed"))
            times["tunepilot bucketed"].append(tunepilot(data, False, root / "bucketed"))
            times["TRL SFTTrainer packing"].append(trl_run(data, root / "trl"))
    rate = {k: tokens / statistics.median(v) for k, v in times.items()}
    print(f"{len(data)} examples, {tokens:,} real tokens, one epoch, 1 thread, "
          f"{args.repeats} interleaved repeat(s), median wall time")
    print("| run | seconds (each repeat) | tokens/s |\n|---|---|---|")
    for k, v in times.items():
        print(f"| {k} | {', '.join(f'{s:.1f}' for s in v)} | {rate[k]:,.0f} |")
    vs_trl = rate["tunepilot packed"] / rate["TRL SFTTrainer packing"]
    vs_bucketed = rate["tunepilot packed"] / rate["tunepilot bucketed"]
    print(f"tunepilot packed / TRL packing: {vs_trl:.2f}x (goal >= 1.8)")
    print(f"tunepilot packed / tunepilot bucketed: {vs_bucketed:.2f}x (goal >= 1.0)")
    print(f"tunepilot bucketed / TRL packing: "
          f"{rate['tunepilot bucketed'] / rate['TRL SFTTrainer packing']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
