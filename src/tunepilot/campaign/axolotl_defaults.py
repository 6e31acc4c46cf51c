"""The settings Axolotl applies when its config leaves a key out, made explicit in the campaign.

A converted campaign must train and size what Axolotl would have trained: where an Axolotl
key is absent and its default differs from the campaign's own, the converter writes
Axolotl's value, with a comment saying it is Axolotl's default. The values are Axolotl's
(`utils/schemas/training.py`, `utils/schemas/config.py`, `normalize_config`, the trainer
builder's warmup) and the Hugging Face `TrainingArguments` defaults it passes through:

* micro_batch_size 1 and gradient_accumulation_steps 1 (the campaign's are 2 and 8);
* eval_batch_size = micro_batch_size (the campaign's is 32: a 32 x sequence_len evaluation
  batch of an 8B model sizes at hundreds of GiB where Axolotl evaluates one row at a time);
* lr_scheduler cosine (the campaign's is linear), num_epochs 1 when max_steps is absent;
* sequence_len 512 (the campaign's max_length is 128);
* seed 42 (`TrainingArguments.seed`; the campaign's is 0);
* bf16 `auto`: bf16 where the GPU has it, which is what `training.precision: bf16` and an
  unset `model.base_dtype` do on such a GPU;
* warmup: min(3% of the steps, 100), 2 when that is 1, known here only with max_steps.

Defaults that already agree (weight_decay 0, max_grad_norm 1.0, lora_dropout 0,
train_on_inputs false) are left to the schema, said once there.
"""

from __future__ import annotations

from typing import Any, Protocol


class Conversion(Protocol):
    """What these defaults write into: `axolotl.Conversion` (kept apart so neither module
    imports the other back)."""

    unknown: list[str]

    def put(self, dotted: str, value: Any, origin: str) -> None: ...

# axolotl key -> (campaign key, Axolotl's value when the key is absent or null)
PLAIN_DEFAULTS: dict[str, tuple[str, Any]] = {
    "micro_batch_size": ("training.microbatch", 1),
    "gradient_accumulation_steps": ("training.accumulation", 1),
    "lr_scheduler": ("training.scheduler", "cosine"),
    "sequence_len": ("data.max_length", 512),
}
AXOLOTL_SEED = 42  # TrainingArguments.seed, which Axolotl passes through when `seed` is absent


def axolotl_warmup(total_steps: int, ratio: float | None = None) -> int:
    """Axolotl's warmup when `warmup_steps` is absent: the ratio's share, else 3% of the
    steps capped at 100; a warmup of one step becomes two."""
    steps = max(int(ratio * total_steps), 0) if ratio is not None else min(
        int(0.03 * total_steps), 100)  # fmt: skip
    return 2 if steps == 1 else steps


def seed_runs(out: Conversion, seed: Any, origin: str) -> None:
    """Axolotl trains one seed: the campaign's runs use it (`seeds`), and so does the pilot."""
    if seed is not None:
        out.put("training.seed", seed, origin)
        out.put("seeds", [seed], origin)


def _absent(config: dict[str, Any], key: str) -> bool:
    return config.get(key) is None


def apply_axolotl_defaults(out: Conversion, config: dict[str, Any]) -> None:
    """Write Axolotl's value for every key the config left out whose default differs."""
    for key, (dotted, value) in PLAIN_DEFAULTS.items():
        if _absent(config, key):
            out.put(dotted, value, f"Axolotl's default `{key}: {value}`")
    if _absent(config, "seed"):
        seed_runs(out, AXOLOTL_SEED, f"Axolotl's default seed {AXOLOTL_SEED} (TrainingArguments)")
    if _absent(config, "eval_batch_size"):
        micro = config.get("micro_batch_size") or PLAIN_DEFAULTS["micro_batch_size"][1]
        out.put("training.eval_batch_size", micro,
                "Axolotl's default: eval_batch_size = micro_batch_size")  # fmt: skip
    if _absent(config, "max_steps") and _absent(config, "num_epochs"):
        out.put("training.budget.epochs", 1, "Axolotl's default `num_epochs: 1`")
    if _absent(config, "bf16") and _absent(config, "fp16"):
        out.put("training.precision", "bf16", "Axolotl's default `bf16: auto` (bf16 on a GPU "
                "that has it)")  # fmt: skip
    if _absent(config, "warmup_steps"):
        ratio = config.get("warmup_ratio")
        steps = config.get("max_steps")
        if isinstance(steps, int) and steps > 0:
            origin = (f"axolotl `warmup_ratio: {ratio}` of max_steps" if ratio is not None
                      else "Axolotl's default warmup: min(3% of max_steps, 100)")  # fmt: skip
            out.put("training.warmup_updates", axolotl_warmup(steps, ratio), origin)
        else:
            head = (f"warmup_ratio: {ratio} (Axolotl warms up for that share" if ratio is not None
                    else "warmup_steps: absent (Axolotl warms up for 3%, at most 100,")  # fmt: skip
            out.unknown.append(f"{head} of the steps, which depend on the data size); set "
                               "training.warmup_updates to that number of updates")
