"""What the automatic checkpoint schedule costs (R1): the same run with `checkpoint_every`
unset (automatic: after update 1, then whenever saving would cost under 2% of the time spent
training, and at the end) and with one checkpoint at the end only.

A tiny Llama, full fine-tune (the checkpoint holds every weight and AdamW's two moments, the
worst case for save time relative to an update), CPU, 2 threads. Printed: wall seconds of each
run, the checkpoints the automatic one wrote, and the ratio. The runs are interleaved
(automatic, end-only, automatic, end-only) after one discarded warm-up run, so neither side
pays the process's one-off start-up costs and load on the machine hits both alike.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

UPDATES = 150
ROUNDS = 2


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tunepilot.campaign import TrainingSettings
    from tunepilot.model.tiny import DEFAULT_CORPUS, build_tiny_llama
    from tunepilot.tasks.base import IGNORE_INDEX, Encoded
    from tunepilot.train.loop import train

    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    base = build_tiny_llama(work / "base")
    tok = AutoTokenizer.from_pretrained(str(base))
    data = []
    for i in range(64):
        text = " ".join(DEFAULT_CORPUS[(i + k) % len(DEFAULT_CORPUS)] for k in range(3))
        ids = tok(text)["input_ids"][:48] + [tok.eos_token_id]
        data.append(Encoded(f"ex{i}", ids, [IGNORE_INDEX] * 3 + ids[3:], 3, False, False,
                            len(ids)))  # fmt: skip

    def run(name: str, every: int | None) -> tuple[float, int]:
        settings = TrainingSettings(microbatch=4, accumulation=2, budget={"updates": UPDATES},
                                    lr=1e-3, checkpoint_every=every, keep_last_checkpoints=1000)
        model = AutoModelForCausalLM.from_pretrained(str(base))
        folder = work / name
        start = time.perf_counter()
        train(model, data, settings, folder, kind="causal_lm", pad_id=tok.pad_token_id,
              progress=False)  # fmt: skip
        seconds = time.perf_counter() - start
        return seconds, len(list((folder / "checkpoints").glob("step-*")))

    run("warm-up", 10**9)  # the first run in a process pays one-off costs: keep it out
    auto, end_only = [], []
    for i in range(ROUNDS):
        auto.append(run(f"auto-{i}", None))
        end_only.append(run(f"end-{i}", 10**9))
    a, e = min(s for s, _ in auto), min(s for s, _ in end_only)
    print(f"{UPDATES} updates, full fine-tune of a tiny Llama, CPU, 2 threads, best of {ROUNDS}")
    print(f"automatic schedule: {a:.2f} s, {auto[0][1]} checkpoints")
    print(f"end only:           {e:.2f} s, {end_only[0][1]} checkpoint")
    print(f"ratio automatic / end only: {a / e:.3f}")


if __name__ == "__main__":
    main()
