"""The campaign file (H1, H2): what the user wants to improve, what must not degrade, and how.

A campaign is YAML loaded into the pydantic models below. Defaults live here, once; the rest
of the code reads typed attributes, never `cfg.get("key", default)`. Unknown keys are errors
with a did-you-mean, and every problem is reported at once with its dotted key path, the YAML
line, what was found and the fix (see `load_campaign`). Importing this module must stay cheap:
no torch, no transformers.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from tunepilot.campaign.audit_settings import AuditSettings
from tunepilot.campaign.bounds import Name, Seed, Seeds, Strict
from tunepilot.campaign.card_settings import CardSettings
from tunepilot.campaign.chat import ChatSettings
from tunepilot.campaign.data_parts import (  # noqa: F401  (re-exported)
    CLEANING_RULES,
    CleaningRule,
    DatasetSource,
    Fields,
    SplitPolicy,
)
from tunepilot.campaign.hypothesis import (
    CLASSIFICATION_TASKS,
    Hypothesis,
)
from tunepilot.campaign.image_settings import ImageSettings
from tunepilot.campaign.model_settings import LoraSettings as LoraSettings
from tunepilot.campaign.model_settings import ModelSettings
from tunepilot.campaign.plan_settings import Rental, TestPolicy, Variant
from tunepilot.campaign.training_parts import Budget, LossSettings, StopCauses

# --------------------------------------------------------------------------------------------
# data (D1-D8)
# --------------------------------------------------------------------------------------------


# Cleaning rules, Fields, SplitPolicy and DatasetSource live in data_parts.py (re-exported).


class DataSettings(Strict):
    """Where the examples are and how they become model inputs (D1-D8)."""

    file: str | None = Field(default=None, description="One file, split by `split.policy`.")
    dataset: DatasetSource | None = Field(
        default=None, description="A Hub dataset (or local dataset folder) instead of a file."
    )
    files: dict[Literal["train", "validation", "test"], str] | None = Field(
        default=None, description="Your own split files (sets split.policy to files)."
    )
    format: Literal["auto", "jsonl", "csv", "tsv", "parquet"] = "auto"
    quoting: bool = Field(default=True, description="CSV/TSV quote handling; off for raw TSV.")
    header: bool = Field(default=True, description="CSV/TSV first line names the columns.")
    columns: list[str] | None = Field(default=None, description="Column names when no header.")
    fields: Fields = Field(default_factory=Fields)
    chat: ChatSettings | None = Field(
        default=None, description="Conversation rows rendered with the chat template."
    )
    labels: list[str] | None = Field(
        default=None, description="Class names in id order; taken from training data if absent."
    )
    cleaning: list[CleaningRule] = Field(
        default_factory=lambda: ["nfc", "strip", "collapse_whitespace", "drop_empty"]
    )
    split: SplitPolicy = Field(default_factory=SplitPolicy)
    max_length: int = Field(default=128, ge=8, le=2**20, description="Tokens per example.")
    packing: bool = Field(default=False, description="Causal LM: bin-pack each microbatch's "
                          "examples into rows of max_length, attention and positions kept "
                          "per example, the same target tokens counted.")  # fmt: skip
    template: str = Field(
        default="{text}\n",
        description="Prompt template for generation tasks; fields in braces.",
    )
    mask_prompt: bool = Field(default=True, description="Prompt tokens carry no loss (D5).")
    audit: AuditSettings = Field(default_factory=AuditSettings)
    images: ImageSettings = Field(default_factory=ImageSettings)

    @field_validator("labels")
    @classmethod
    def _labels_unique(cls, labels: list[str] | None) -> list[str] | None:
        """Two classes with one name would share an id: the model could not tell them apart."""
        if labels is not None:
            twice = sorted({n for n in labels if labels.count(n) > 1})
            if twice:
                raise ValueError(f"class name(s) {', '.join(map(repr, twice))} appear more than "
                                 "once; give each class one name, once")
        return labels

    @model_validator(mode="after")
    def _one_source(self) -> DataSettings:
        if sum(x is not None for x in (self.file, self.files, self.dataset)) != 1:
            raise ValueError("give exactly one of `data.file`, `data.files` or `data.dataset`")
        if self.files is not None:
            if "train" not in self.files:
                raise ValueError("`data.files` needs a `train` entry")
            if self.split.policy != "files":
                self.split.policy = "files"
        if self.files is None and self.split.policy == "files":
            raise ValueError("split.policy `files` needs `data.files`, not `data.file` or "
                             "`data.dataset`")
        if self.split.policy == "group" and not self.fields.group:
            raise ValueError("split.policy `group` needs `data.fields.group`")
        if self.split.policy == "time" and not self.fields.time:
            raise ValueError("split.policy `time` needs `data.fields.time`")
        return self


# --------------------------------------------------------------------------------------------
# training (S2, S3, S7, B3, B4)
# --------------------------------------------------------------------------------------------


# Budget and StopCauses live in training_parts.py (re-exported here).


OptimizerName = Literal[
    "adamw", "adamw_bf16_states", "adamw_8bit", "paged_adamw_8bit", "sgd", "adafactor"
]


class Distributed(Strict):
    strategy: Literal["none", "ddp", "fsdp"] = "none"
    nproc: int = Field(default=1, ge=1)


class TrainingSettings(LossSettings):
    microbatch: int = Field(default=2, ge=1)
    accumulation: int = Field(default=8, ge=1)
    budget: Budget = Field(default_factory=lambda: Budget(updates=200))
    lr: float = Field(default=1e-4, gt=0, lt=1)
    scheduler: Literal["constant", "linear", "cosine"] = "linear"
    warmup_updates: int = Field(default=0, ge=0)
    weight_decay: float = Field(default=0.0, ge=0, le=1)
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    precision: Literal["fp32", "bf16", "fp16"] | None = Field(
        default=None,
        description="Autocast of the forward: bf16, fp16 (CUDA, with loss scaling) or fp32. "
        "Unset: bf16 on a CUDA card that has it, fp32 elsewhere (CPU, T4, V100).",
    )
    activation_checkpointing: bool = False
    weights_dtype: Literal["fp32", "bf16"] = Field(
        default="fp32",
        description="dtype of the trained weights (LoRA, modules_to_save, every weight of a "
        "full fine-tune) and so of their gradients: bf16 is pure bf16 training (torchtune's "
        "default); fp32 keeps updates smaller than a bf16 ulp.",
    )
    optimizer: OptimizerName = Field(
        default="adamw",
        description="adamw (torch; state in the weights' dtype, fused on CUDA), "
        "adamw_bf16_states (torch AdamW, moments kept in bf16), adamw_8bit and "
        "paged_adamw_8bit (bitsandbytes, CUDA only; paged state lives in CUDA unified memory), "
        "sgd (momentum 0.9), adafactor (torch).",
    )
    optimizer_in_backward: bool = Field(
        default=False,
        description="Step each parameter in its post-accumulate-grad hook and free its "
        "gradient at once (torch's documented pattern): no full set of gradients is ever held. "
        "Needs accumulation 1, max_grad_norm null and one process.",
    )
    tf32: bool = Field(
        default=True,
        description="On CUDA, fp32 matmuls and convolutions use TF32 tensor cores "
        "(torch.backends.cuda.matmul.allow_tf32, cudnn.allow_tf32); recorded in env.json.",
    )
    seed: Seed = 0
    eval_every: int = Field(default=50, ge=1, description="Updates between validation points.")
    eval_batch_size: int = Field(
        default=32, ge=1,
        description="Examples per evaluation batch. Unset: a run uses 32, and `tunepilot plan` "
        "sizes each card's evaluation at the largest batch that fits it (at most 32) and puts "
        "that value in every command of the card's package; set, it is judged as it is.",
    )  # fmt: skip
    drop_last: bool = False
    bucket_by_length: bool = True
    checkpoint_every: int | None = Field(
        default=None, ge=1,
        description="Updates between checkpoints; null: automatic (saving costs under 2% of "
        "the wall time), plus one at the end and one when SIGTERM or Ctrl-C stops the run.",
    )  # fmt: skip
    keep_last_checkpoints: int = Field(default=2, ge=1)
    stop: StopCauses = Field(default_factory=StopCauses)
    distributed: Distributed = Field(default_factory=Distributed)
    max_new_tokens: int = Field(
        default=64, ge=1, le=2**20, description="Generation budget at evaluation."
    )

    @model_validator(mode="after")
    def _optimizer_fits_the_step(self) -> TrainingSettings:
        """Combinations that cannot train as asked (S2, S3), refused with the fix."""
        from tunepilot.campaign.optimizer_rules import optimizer_problems

        problems = optimizer_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class Campaign(Strict):
    """A whole campaign: hypothesis first, then the model, the data and the training plan."""

    name: Name
    hypothesis: Hypothesis
    model: ModelSettings
    data: DataSettings
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    variants: dict[Name, Variant] = Field(default_factory=dict)
    seeds: Seeds = Field(default_factory=lambda: [0], description="Every variant runs each seed.")
    test_policy: TestPolicy = Field(default_factory=TestPolicy)
    rental: Rental = Field(default_factory=Rental)
    tracking: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=list,
        description="Trackers that also receive every run's curve and evaluations "
        "(under <campaign>/tracking/; wandb: offline there unless WANDB_API_KEY is set); the "
        "ledger stays the source of truth.",
    )
    card: CardSettings = Field(
        default_factory=CardSettings,
        description="What the exported model card states that the runs cannot know "
        "(license, language, the data's name and Hub ids).",
    )

    @model_validator(mode="after")
    def _task_needs_its_fields(self) -> Campaign:
        task = self.hypothesis.task
        if task == "classification" and not self.data.fields.label:
            raise ValueError("a classification campaign needs `data.fields.label`")
        if task == "image_classification":
            if "cleaning" not in self.data.model_fields_set:
                self.data.cleaning = []  # text rules would rewrite file paths
            elif self.data.cleaning:
                raise ValueError(
                    "data.cleaning rules apply to text; an image campaign takes none "
                    "(declare image transforms in data.images.augment)"
                )
        if self.data.chat is not None and task in CLASSIFICATION_TASKS:
            raise ValueError(
                "`data.chat` is for format or extraction campaigns (the answer is the last "
                "assistant turn); remove it or set hypothesis.task: format"
            )
        if task in ("extraction", "format") and not (
            self.data.fields.target or self.data.chat is not None
        ):
            raise ValueError(f"a {task} campaign needs `data.fields.target` (or `data.chat`)")
        if self.data.packing and task in CLASSIFICATION_TASKS:
            raise ValueError(f"`data.packing: true` joins examples into rows, which only a "
                             f"causal LM (format, extraction) trains; a {task} campaign has "
                             "one label per example: set data.packing: false")  # fmt: skip
        if "control" in self.variants:
            raise ValueError("`control` is the campaign itself; name the variant differently")
        return self

    def config_hash(self) -> str:
        """A short, stable hash of the resolved campaign (recorded with every run)."""
        # Trackers copy what a run records and the card describes it; neither changes what
        # a run computes.
        return stable_hash(self.model_dump(mode="json", exclude={"tracking", "card"}))


def stable_hash(obj: Any, length: int = 16) -> str:
    """sha256 of canonical JSON: the same value always hashes the same, whatever key order."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]
