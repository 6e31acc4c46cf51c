"""`--from-axolotl` carries Axolotl's own defaults for every key a config leaves out that
changes what is trained or sized (eval batch = micro batch, scheduler, sequence length, seed,
batch shape, warmup), so the converted campaign trains and sizes what Axolotl would."""

from __future__ import annotations

from pathlib import Path

from tunepilot.campaign import validate_mapping
from tunepilot.campaign.axolotl import convert, render

# Axolotl's examples/llama-3/qlora.yml (axolotl-ai-cloud/axolotl), as published.
AXOLOTL_QLORA = """\
base_model: NousResearch/Meta-Llama-3-8B
model_type: AutoModelForCausalLM
tokenizer_type: AutoTokenizer
load_in_8bit: false
load_in_4bit: true
strict: false
datasets:
  - path: aaditya/alpaca_subset_1
    type: alpaca
dataset_prepared_path:
val_set_size: 0
output_dir: ./outputs/qlora-out
adapter: qlora
lora_model_dir:
sequence_len: 4096
sample_packing: true
pad_to_sequence_len: true
lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_target_linear: true
wandb_project:
wandb_entity:
wandb_watch:
wandb_name:
wandb_log_model:
gradient_accumulation_steps: 4
micro_batch_size: 2
num_epochs: 4
optimizer: paged_adamw_32bit
lr_scheduler: cosine
learning_rate: 0.0002
bf16: auto
tf32: false
gradient_checkpointing: true
resume_from_checkpoint:
logging_steps: 1
flash_attention: true
warmup_steps: 10
evals_per_epoch: 4
saves_per_epoch: 1
weight_decay: 0.0
special_tokens:
  pad_token: "<|end_of_text|>"
"""


def _campaign(config: dict):
    out = convert(config, "c")
    return validate_mapping(out.stated(), source="converted"), out


def test_s1_converted_qlora_example_evaluates_at_axolotls_micro_batch_not_32() -> None:
    import yaml

    c, out = _campaign(yaml.safe_load(AXOLOTL_QLORA))
    t = c.training
    assert (t.microbatch, t.eval_batch_size, t.accumulation) == (2, 2, 4)
    assert c.data.max_length == 4096 and c.model.base_dtype == "nf4"
    assert (t.scheduler, t.warmup_updates, t.budget.epochs) == ("cosine", 10, 4)
    assert t.precision == "bf16"
    assert c.seeds == [42] and t.seed == 42
    text = render(out, Path("qlora.yml"))
    assert "eval_batch_size: 2  # Axolotl's default: eval_batch_size = micro_batch_size" in text


def test_s7_absent_axolotl_keys_take_axolotls_defaults_not_the_campaigns() -> None:
    config = {"base_model": "org/m", "adapter": "lora", "learning_rate": 1e-4,
              "datasets": [{"path": "d.jsonl", "type": "alpaca"}]}
    c, out = _campaign(config)
    t = c.training
    assert (t.microbatch, t.accumulation, t.eval_batch_size) == (1, 1, 1)
    assert (t.scheduler, t.budget.epochs, t.budget.updates) == ("cosine", 1, None)
    assert (c.data.max_length, c.seeds, t.precision) == (512, [42], "bf16")
    assert any(line.startswith("warmup_steps: absent (Axolotl warms up for 3%, at most 100,")
               for line in out.unknown)


def test_s7_axolotl_default_warmup_is_three_percent_of_max_steps_capped_at_100() -> None:
    base = {"base_model": "org/m", "learning_rate": 1e-4, "datasets": [{"path": "d.jsonl"}]}
    assert _campaign({**base, "max_steps": 1000})[0].training.warmup_updates == 30
    assert _campaign({**base, "max_steps": 50})[0].training.warmup_updates == 2  # 1 becomes 2
    assert _campaign({**base, "max_steps": 10_000})[0].training.warmup_updates == 100
    ratio = _campaign({**base, "max_steps": 200, "warmup_ratio": 0.1})[0]
    assert ratio.training.warmup_updates == 20
    fp16 = _campaign({**base, "fp16": True, "micro_batch_size": 4, "eval_batch_size": 8})[0]
    assert (fp16.training.precision, fp16.training.eval_batch_size) == ("fp16", 8)


def test_v5_an_axolotl_wandb_project_turns_on_the_wandb_tracker() -> None:
    base = {"base_model": "org/m", "learning_rate": 1e-4, "datasets": [{"path": "d.jsonl"}]}
    assert _campaign({**base, "wandb_project": "team-sft"})[0].tracking == ["wandb"]
    assert _campaign(base)[0].tracking == []


def test_h1_validate_refuses_the_converters_placeholder_hypothesis(tmp_path: Path) -> None:
    import subprocess
    import sys

    source = tmp_path / "qlora.yml"
    source.write_text(AXOLOTL_QLORA, encoding="utf-8")
    cli = [sys.executable, "-m", "tunepilot.cli"]
    made = subprocess.run([*cli, "init", str(tmp_path / "c"), "--from-axolotl", str(source)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr
    path = tmp_path / "c" / "campaign.yaml"
    done = subprocess.run([*cli, "validate", str(path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2
    said = " ".join(done.stderr.split())
    assert "hypothesis.behaviour" in said and "placeholder" in said
    assert f"{path}:" in said  # names the file and line


def test_h1_init_names_the_campaign_after_its_folder(tmp_path: Path) -> None:
    from tunepilot.campaign import load_campaign
    from tunepilot.campaign.templates import write_template

    for task in ("classification", "extraction", "chat"):
        path = write_template(tmp_path / f"refund queue {task}", task)
        assert load_campaign(path).name == f"refund-queue-{task}"
