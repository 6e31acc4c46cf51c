"""`tunepilot init DIR --from-axolotl FILE` (P1, P2): the keys an Axolotl LoRA config
shares with the campaign are carried over with a comment naming their source, the others are
listed on stderr (exit 0), and an unreadable file is exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tunepilot.campaign import load_campaign

# Axolotl's examples/llama-3/lora-1b.yml, with its dataset switched to the chat_template type.
AXOLOTL_LORA = """\
base_model: NousResearch/Llama-3.2-1B
revision_of_model: 4e20de362430cd3b72f300e6b0f18e50e7166e08
model_type: LlamaForCausalLM
tokenizer_type: AutoTokenizer

load_in_8bit: true
load_in_4bit: false
strict: false

chat_template: tokenizer_default
datasets:
  - path: data/support_chats.jsonl
    type: chat_template
    field_messages: conversations
    message_property_mappings:
      role: from
      content: value
    roles:
      user: ["human", "user"]
      assistant: ["gpt", "assistant"]
dataset_prepared_path:
val_set_size: 0.05
output_dir: ./outputs/lora-out

adapter: lora
lora_model_dir:

sequence_len: 2048
sample_packing: true
eval_sample_packing: true
pad_to_sequence_len: true

lora_r: 16
lora_alpha: 32
lora_dropout: 0.05
lora_fan_in_fan_out:
lora_target_modules:
  - gate_proj
  - down_proj
  - up_proj
  - q_proj
  - v_proj
  - k_proj
  - o_proj

wandb_project:
wandb_entity:
wandb_watch:
wandb_name:
wandb_log_model:

gradient_accumulation_steps: 2
micro_batch_size: 2
num_epochs: 1
optimizer: adamw_8bit
lr_scheduler: cosine
learning_rate: 0.0002

train_on_inputs: false
group_by_length: false
bf16: auto
fp16:
tf32: false

gradient_checkpointing: true
early_stopping_patience:
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


def _load_stated(path: Path):
    """The converted campaign once its user has stated the behaviour (the placeholder is
    refused by `validate` until then)."""
    from tunepilot.campaign.hypothesis import PLACEHOLDER_BEHAVIOUR

    path.write_text(path.read_text().replace(PLACEHOLDER_BEHAVIOUR, "Answer in the house style"))
    return load_campaign(path)


def init(directory: Path, source: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tunepilot.cli", "init", str(directory), "--from-axolotl",
         str(source)], capture_output=True, text=True, check=False)  # fmt: skip


def test_p1_axolotl_lora_config_converts_its_keys_and_lists_the_rest(tmp_path: Path) -> None:
    source = tmp_path / "lora-1b.yml"
    source.write_text(AXOLOTL_LORA, encoding="utf-8")
    done = init(tmp_path / "support", source)
    assert done.returncode == 0, done.stderr
    c = _load_stated(tmp_path / "support" / "campaign.yaml")
    assert (c.model.name_or_path, c.model.method) == ("NousResearch/Llama-3.2-1B", "lora")
    assert c.model.revision == "4e20de362430cd3b72f300e6b0f18e50e7166e08"
    assert (c.model.lora.r, c.model.lora.alpha, c.model.lora.dropout) == (16, 32, 0.05)
    assert c.model.lora.target_modules == ["gate_proj", "down_proj", "up_proj", "q_proj",
                                           "v_proj", "k_proj", "o_proj"]  # fmt: skip
    assert c.model.attn_implementation == "flash_attention_2" and c.model.base_dtype == "int8"
    t = c.training
    assert (t.lr, t.microbatch, t.accumulation, t.budget.epochs) == (2e-4, 2, 2, 1)
    assert (t.scheduler, t.precision, t.warmup_updates) == ("cosine", "bf16", 10)
    assert t.activation_checkpointing is True and t.weight_decay == 0.0
    d = c.data
    assert (d.file, d.max_length, d.split.validation, d.mask_prompt) == (
        "data/support_chats.jsonl", 2048, 0.05, True)  # fmt: skip
    assert d.packing is True  # axolotl `sample_packing`
    assert d.chat is not None and d.chat.field_messages == "conversations"
    assert d.chat.message_property_mappings == {"role": "from", "content": "value"}
    assert d.chat.roles["assistant"] == ["gpt", "assistant"]
    assert d.chat.chat_template_jinja is None
    text = (tmp_path / "support" / "campaign.yaml").read_text()
    assert "r: 16  # axolotl `lora_r`" in text and "lr: 0.0002  # axolotl `learning_rate`" in text
    listed = done.stderr
    for key in (
        "model_type",
        "tokenizer_type",
        "pad_to_sequence_len",
        "optimizer",
        "evals_per_epoch",
        "special_tokens",
    ):
        assert f"{key}:" in listed, key  # fmt: skip
    for quiet in ("load_in_4bit", "load_in_8bit", "wandb_project", "fp16", "lora_fan_in_fan_out"):
        assert f"{quiet}:" not in listed, quiet  # unset or false: nothing was lost
    assert "# Not carried over from the Axolotl config:" in text


def test_h1_unreadable_axolotl_file_is_exit_2_naming_it(tmp_path: Path) -> None:
    missing = init(tmp_path / "a", tmp_path / "absent.yml")
    assert missing.returncode == 2 and "absent.yml" in missing.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text("base_model: x\nlora_r: [16\n", encoding="utf-8")
    bad = init(tmp_path / "b", broken)
    assert bad.returncode == 2 and "not valid YAML" in bad.stderr
    assert not (tmp_path / "b" / "campaign.yaml").exists()
    looped = tmp_path / "looped.yml"  # was a circular-reference traceback (exit 3)
    looped.write_text("base_model: x\nlora_target_modules: &t [*t]\n", encoding="utf-8")
    done = init(tmp_path / "c", looped)
    assert done.returncode == 2 and "used inside itself" in done.stderr, done.stderr


def test_p1_qlora_becomes_lora_on_a_4_bit_base_and_max_steps_wins_over_epochs() -> None:
    from tunepilot.campaign import validate_mapping
    from tunepilot.campaign.axolotl import convert

    config = {"base_model": "org/m", "adapter": "qlora", "load_in_4bit": True,
              "num_epochs": 3, "max_steps": 200, "datasets": [{"path": "d.jsonl",
              "type": "sharegpt"}], "lr_scheduler": "one_cycle"}  # fmt: skip
    out = convert(config, "q")
    c = validate_mapping(out.stated())
    assert (c.model.method, c.model.base_dtype) == ("lora", "nf4")
    assert (c.training.budget.updates, c.training.budget.epochs) == (200, None)
    assert c.data.chat is not None and c.data.chat.field_messages == "conversations"
    assert c.data.chat.message_property_mappings == {"role": "from", "content": "value"}
    assert any(u.startswith("num_epochs:") for u in out.unknown)
    assert any(u.startswith("lr_scheduler:") and "one_cycle" in u for u in out.unknown)


# Axolotl's examples/llama-3/qlora.yml and fft-8b.yaml (trimmed of blank keys): a 4-bit base
# adapted on every linear layer with no validation split, and a full fine-tune on a Hub chat
# dataset sliced to 20%.
AXOLOTL_QLORA = """\
base_model: meta-llama/Meta-Llama-3-8B
load_in_4bit: true
datasets:
  - path: aaditya/alpaca_subset_1
    type: alpaca
val_set_size: 0
adapter: qlora
sequence_len: 4096
lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_target_modules:
lora_target_linear: true
gradient_accumulation_steps: 4
micro_batch_size: 2
num_epochs: 4
optimizer: paged_adamw_32bit
learning_rate: 0.0002
"""
AXOLOTL_FFT = """\
base_model: NousResearch/Meta-Llama-3.1-8B
plugins:
  - axolotl.integrations.liger.LigerPlugin
chat_template: llama3
datasets:
  - path: mlabonne/FineTome-100k
    type: chat_template
    split: train[:20%]
    field_messages: conversations
    message_field_role: from
    message_field_content: value
val_set_size: 0.02
sequence_len: 4096
gradient_accumulation_steps: 8
micro_batch_size: 1
num_epochs: 1
learning_rate: 2e-5
eval_steps: 0.05
save_steps: 100
warmup_ratio: 0.1
rl: dpo
"""


def test_p2_qlora_on_every_linear_layer_keeps_its_targets_and_names_what_it_lacks():
    import yaml

    from tunepilot.campaign import validate_mapping
    from tunepilot.campaign.axolotl import convert

    out = convert(yaml.safe_load(AXOLOTL_QLORA), "q")
    c = validate_mapping(out.stated())
    assert (c.model.method, c.model.base_dtype) == ("lora", "nf4")
    assert c.model.lora.target_modules == ["all-linear"]  # not the q_proj/v_proj default
    listed = "\n".join(out.unknown)
    assert "val_set_size: 0" in listed and "data.split.validation" in listed
    assert "aaditya/alpaca_subset_1` is a Hub dataset" in listed and "save_to_disk" in listed
    assert "revision_of_model: absent" in listed and "model.revision" in listed
    assert "datasets[0].type: `alpaca`" in listed


def test_p1_full_fine_tune_on_a_sliced_hub_chat_dataset_lists_every_difference(
    tmp_path: Path,
):
    source = tmp_path / "fft-8b.yaml"
    source.write_text(AXOLOTL_FFT, encoding="utf-8")
    done = init(tmp_path / "fft", source)
    assert done.returncode == 0, done.stderr  # a share-of-steps eval_steps is listed, not fatal
    c = _load_stated(tmp_path / "fft" / "campaign.yaml")
    assert c.model.method == "full" and c.training.lr == 2e-5  # YAML 1.1 reads 2e-5 as text
    assert c.training.checkpoint_every == 100 and c.training.eval_every != 0.05
    assert c.data.chat is not None
    assert c.data.chat.message_property_mappings == {"role": "from", "content": "value"}
    listed = done.stderr.replace("\n", " ")
    for expected in ("datasets[0].split: `train[:20%]`", "eval_steps: 0.05 (a share of all steps",
                     "rl: \"dpo\" (preference training", "warmup_ratio: 0.1",
                     "chat_template: `llama3`", "plugins:", "FineTome-100k` is a Hub dataset"):
        assert expected in listed, expected  # fmt: skip


def test_a_config_with_thousands_of_unknown_keys_is_summarised_not_listed(tmp_path: Path) -> None:
    """A 50 MB machine-written config with 550,000 unknown keys took 165 s and wrote 44 MB to
    stderr, one line per key. The file and the terminal now list the first keys and count the
    rest (benchmarks/bench_scale.py times the 50 MB case)."""
    source = tmp_path / "big.yml"
    keys = "".join(f"generated_setting_{i:05d}: value {i}\n" for i in range(5_000))
    source.write_text(AXOLOTL_LORA + keys, encoding="utf-8")
    done = init(tmp_path / "camp", source)
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "camp" / "campaign.yaml").read_text(encoding="utf-8")
    tail = written.split("# Not carried over from the Axolotl config:\n")[1].splitlines()
    shown = [line for line in done.stderr.splitlines() if line.startswith("  ")]
    assert len(tail) == len(shown) == 41  # 40 keys, then the count
    assert "not carried over from" in done.stderr and "more keys with no campaign" in tail[-1]
    more = int(tail[-1].split("and ")[1].split(" more")[0].replace(",", ""))
    assert more + 40 == int(done.stderr.split("(")[1].split(")")[0].replace(",", ""))
    _load_stated(tmp_path / "camp" / "campaign.yaml")  # still a campaign that loads
