"""`tunepilot init DIR --from-axolotl FILE`: an Axolotl config becomes a commented campaign.

Users arrive with an Axolotl YAML that already says which base, which adapter and which
optimiser settings they trust. The keys that mean the same thing here are carried over, each
with a comment naming the Axolotl key it came from; every other key is listed, never dropped
silently, because a setting the campaign does not carry is a difference between the two runs.
What Axolotl does not have (the hypothesis and its guards, H1-H2) is left for the user to state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tunepilot.campaign.axolotl_defaults import apply_axolotl_defaults, seed_runs
from tunepilot.campaign.checks import hub_id_form
from tunepilot.campaign.hypothesis import PLACEHOLDER_BEHAVIOUR
from tunepilot.campaign.yaml_reader import read_yaml
from tunepilot.errors import InputError, Problem, input_error

# axolotl key -> campaign key (dotted), for values that carry over unchanged.
DIRECT = {
    "base_model": "model.name_or_path",
    "revision_of_model": "model.revision",
    "trust_remote_code": "model.trust_remote_code",
    "lora_r": "model.lora.r",
    "lora_alpha": "model.lora.alpha",
    "lora_dropout": "model.lora.dropout",
    "lora_target_modules": "model.lora.target_modules",
    "lora_modules_to_save": "model.lora.modules_to_save",
    "sequence_len": "data.max_length",
    "sample_packing": "data.packing",
    "micro_batch_size": "training.microbatch",
    "eval_batch_size": "training.eval_batch_size",
    "gradient_accumulation_steps": "training.accumulation",
    "learning_rate": "training.lr",
    "warmup_steps": "training.warmup_updates",
    "weight_decay": "training.weight_decay",
    "max_grad_norm": "training.max_grad_norm",
    "gradient_checkpointing": "training.activation_checkpointing",
    "save_total_limit": "training.keep_last_checkpoints",
    "num_epochs": "training.budget.epochs",
    "max_steps": "training.budget.updates",
}
# Why common keys that have no campaign equivalent are not carried (others: "no campaign key").
NOT_CARRIED = {
    "optimizer": "training uses AdamW (torch.optim.AdamW)",
    "output_dir": "runs live in the campaign folder (runs/<run-id>/)",
    "special_tokens": "the tokenizer is used as saved; pad = eos when it has no pad token",
    "rl": "preference training (DPO, ORPO, KTO, GRPO) is not a campaign method: the campaign "
    "trains on the answer's likelihood",
    "peft_use_dora": "the adapter is plain LoRA",
    "peft_use_rslora": "the adapter is plain LoRA (alpha / r scaling)",
    "deepspeed": "several GPUs run DDP or FSDP (training.distributed)",
    "fsdp": "several GPUs run DDP or FSDP (training.distributed)",
    "lora_model_dir": "a campaign starts every run from the base",
}
SCHEDULERS = {"cosine": "cosine", "linear": "linear", "constant": "constant"}
# Keys of one `datasets:` entry that map onto data.chat (Axolotl's chat_template type).
CHAT_KEYS = ("field_messages", "message_property_mappings", "roles")
SHAREGPT = {"field_messages": "conversations",
            "message_property_mappings": {"role": "from", "content": "value"}}  # fmt: skip


@dataclass
class Conversion:
    """The campaign mapping built so far, the source of each key, and what was not carried."""

    campaign: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # dotted key -> axolotl key
    unknown: list[str] = field(default_factory=list)  # "key: why" lines

    def stated(self, behaviour: str = "stated by the user") -> dict[str, Any]:
        """The campaign once its user has stated the behaviour: what must load (the placeholder
        itself is refused until it is replaced, H1)."""
        return {**self.campaign, "hypothesis": {**self.campaign["hypothesis"],
                                                "behaviour": behaviour}}  # fmt: skip

    def put(self, dotted: str, value: Any, origin: str) -> None:
        node = self.campaign
        *parents, last = dotted.split(".")
        for name in parents:
            node = node.setdefault(name, {})
        node[last] = value
        self.origin[dotted] = origin


def read_axolotl(path: Path) -> dict[str, Any]:
    """The Axolotl config as a mapping, or an InputError (exit 2) naming the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise input_error(str(path), f"cannot read the Axolotl config ({exc})",
                          "give the path of a readable Axolotl YAML file") from None  # fmt: skip
    config = read_yaml(text, str(path), "invalid Axolotl config")
    if not isinstance(config, dict):
        raise input_error(str(path), f"a YAML {type(config).__name__}, not a mapping of keys",
                          "give an Axolotl config (base_model:, datasets:, ...)")  # fmt: skip
    return config


def convert(config: dict[str, Any], name: str) -> Conversion:
    """Map the keys this tool knows; list the rest with the reason they were not carried."""
    out = Conversion()
    out.put("name", name, "the folder name")
    out.put("hypothesis", {"behaviour": PLACEHOLDER_BEHAVIOUR, "task": "format"},
            "not in Axolotl: state it (H1, H2)")  # fmt: skip
    handlers: dict[str, Callable[[Any], None]] = {
        "adapter": lambda v: _adapter(out, v),
        "lr_scheduler": lambda v: _scheduler(out, v),
        "bf16": lambda v: _precision(out, "bf16", v),
        "fp16": lambda v: _precision(out, "fp16", v),
        "datasets": lambda v: _datasets(out, v, config),
        "val_set_size": lambda v: _validation(out, v),
        "load_in_4bit": lambda v: _base_dtype(out, "nf4", v, "load_in_4bit"),
        "load_in_8bit": lambda v: _base_dtype(out, "int8", v, "load_in_8bit"),
        "train_on_inputs": lambda v: out.put(
            "data.mask_prompt", not v, "axolotl `train_on_inputs`"
        ),
        "flash_attention": lambda v: _attention(out, "flash_attention_2", v, "flash_attention"),
        "sdp_attention": lambda v: _attention(out, "sdpa", v, "sdp_attention"),
        "chat_template": lambda v: None,  # read with `datasets`
        "chat_template_jinja": lambda v: None,
        "lora_target_linear": lambda v: _target_linear(out, v, config),
        "eval_steps": lambda v: _steps(out, "eval_steps", "training.eval_every", v),
        "save_steps": lambda v: _steps(out, "save_steps", "training.checkpoint_every", v),
        "seed": lambda v: seed_runs(out, v, "axolotl `seed`"),
        "warmup_ratio": lambda v: None,  # with the defaults: a share of max_steps
        "wandb_project": lambda v: _wandb(out, v),
    }
    for key, value in config.items():
        if key in DIRECT:
            if value is not None:
                out.put(DIRECT[key], value, f"axolotl `{key}`")
        elif key in handlers:
            handlers[key](value)
        elif value not in (None, False, "", [], {}):
            shown = json.dumps(value, ensure_ascii=False, default=str)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            why = NOT_CARRIED.get(key) or "no campaign key"
            out.unknown.append(f"{key}: {shown} ({why})")
    if "adapter" not in config:
        _adapter(out, None)
    apply_axolotl_defaults(out, config)
    if "training.budget.updates" in out.origin and "training.budget.epochs" in out.origin:
        del out.campaign["training"]["budget"]["epochs"]
        del out.origin["training.budget.epochs"]
        out.unknown.append("num_epochs: max_steps is kept (a campaign fixes one budget, S7)")
    base = config.get("base_model")
    if isinstance(base, str) and "/" in base and hub_id_form(base) and (
            not config.get("revision_of_model")):  # fmt: skip
        out.unknown.append(f"revision_of_model: absent; a Hub base needs model.revision, the "
                           f"commit of `{base}` to train on (P4)")  # fmt: skip
    out.campaign.setdefault("model", {}).setdefault("name_or_path", "path/to/base-model")
    out.campaign.setdefault("data", {}).setdefault("file", "path/to/data.jsonl")
    if "data.chat" not in out.origin:
        out.campaign["data"].setdefault("fields", {"text": "text", "target": "answer"})
    return out


def _wandb(out: Conversion, value: Any) -> None:
    """A W&B project in Axolotl: the campaign copies its runs to W&B too (the project is the
    campaign's name; WANDB_PROJECT picks another)."""
    if value:
        out.put("tracking", ["wandb"],
                f"axolotl `wandb_project: {value}` (export WANDB_PROJECT={value} to log there)")


def _adapter(out: Conversion, value: Any) -> None:
    if value in ("lora", "qlora"):
        out.put("model.method", "lora", f"axolotl `adapter: {value}`")
        if value == "qlora":
            out.put("model.base_dtype", "nf4", "axolotl `adapter: qlora` (4-bit base)")
    elif value in (None, ""):
        out.put("model.method", "full", "axolotl: no `adapter`, so full fine-tuning")
    else:
        out.unknown.append(f"adapter: `{value}` has no campaign equivalent (lora or full)")


def _scheduler(out: Conversion, value: Any) -> None:
    if value in SCHEDULERS:
        out.put("training.scheduler", SCHEDULERS[value], "axolotl `lr_scheduler`")
    else:
        out.unknown.append(f"lr_scheduler: `{value}` (the campaign has constant, linear, cosine)")


def _precision(out: Conversion, kind: str, value: Any) -> None:
    if value in (True, "auto"):
        out.put("training.precision", kind, f"axolotl `{kind}: {value}`")


def _base_dtype(out: Conversion, dtype: str, value: Any, key: str) -> None:
    if value:
        out.put("model.base_dtype", dtype, f"axolotl `{key}`")


def _attention(out: Conversion, implementation: str, value: Any, key: str) -> None:
    if value:
        out.put("model.attn_implementation", implementation, f"axolotl `{key}`")


def _steps(out: Conversion, key: str, dotted: str, value: Any) -> None:
    """Axolotl reads a value below 1 as a share of the total steps; the campaign counts
    updates."""
    if isinstance(value, float) and not value.is_integer():
        out.unknown.append(f"{key}: {value} (a share of all steps in Axolotl); set {dotted} "
                           "to a number of updates")  # fmt: skip
    elif value is not None:
        out.put(dotted, int(value) if isinstance(value, float) else value, f"axolotl `{key}`")


def _target_linear(out: Conversion, value: Any, config: dict[str, Any]) -> None:
    """`lora_target_linear: true` adapts every linear layer: PEFT's `all-linear`."""
    if value:
        out.put("model.lora.target_modules", ["all-linear"], "axolotl `lora_target_linear`")
        if config.get("lora_target_modules"):
            out.unknown.append("lora_target_modules: inside all-linear (lora_target_linear)")


def _validation(out: Conversion, value: Any) -> None:
    if isinstance(value, int | float) and 0 < value < 1:
        out.put("data.split.policy", "random", "axolotl holds out val_set_size at random")
        out.put("data.split.validation", value, "axolotl `val_set_size`")
    elif value == 0:
        out.unknown.append("val_set_size: 0 (no evaluation in Axolotl); a campaign always holds "
                           "out data.split.validation to judge the hypothesis on (H3)")  # fmt: skip
    elif value:
        out.unknown.append(f"val_set_size: {value} rows (the campaign takes a share below 1)")


def _datasets(out: Conversion, value: Any, config: dict[str, Any]) -> None:
    entries = value if isinstance(value, list) else [value]
    if not entries or not isinstance(entries[0], dict):
        out.unknown.append("datasets: not a list of dataset entries")
        return
    first, rest = entries[0], entries[1:]
    for extra in rest:
        out.unknown.append(f"datasets: `{extra.get('path')}` (a campaign reads one source)")
    path = first.get("data_files") or first.get("path")
    if isinstance(path, list):
        path = path[0] if len(path) == 1 else None
    if path:
        out.put("data.file", path, "axolotl `datasets[0].path`")
        if _hub_dataset(str(path), first):
            name = str(path).rstrip("/").split("/")[-1]
            out.unknown.append(
                f"datasets[0].path: `{path}` is a Hub dataset; save it once with "
                f"`python -c \"import datasets; datasets.load_dataset('{path}')"
                f".save_to_disk('{name}')\"` and set data.file to that folder (D1)"
            )
    if first.get("split") not in (None, "train"):
        out.unknown.append(f"datasets[0].split: `{first['split']}` (the campaign reads the whole "
                           "file or the saved split named in data.file, e.g. folder[train])")
    kind = first.get("type")
    if kind in ("chat_template", "sharegpt"):
        chat: dict[str, Any] = dict(SHAREGPT) if kind == "sharegpt" else {}
        chat |= {k: first[k] for k in CHAT_KEYS if first.get(k) is not None}
        if first.get("message_field_role") or first.get("message_field_content"):
            chat["message_property_mappings"] = {
                "role": first.get("message_field_role", "role"),
                "content": first.get("message_field_content", "content"),
            }
        template = first.get("chat_template") or config.get("chat_template")
        if template == "jinja":
            jinja = first.get("chat_template_jinja") or config.get("chat_template_jinja")
            chat["chat_template_jinja"] = jinja
        elif template not in (None, "tokenizer_default"):
            out.unknown.append(f"chat_template: `{template}` is a name Axolotl expands; paste "
                               "its Jinja into data.chat.chat_template_jinja, or keep the "
                               "tokenizer's own")  # fmt: skip
        trained = first.get("roles_to_train")
        if trained not in (None, ["assistant"], ["gpt"]):
            out.unknown.append(f"roles_to_train: {trained} (the loss is on assistant turns)")
        out.put("data.chat", chat, f"axolotl `datasets[0]` of type {kind}")
    elif kind is not None:
        out.unknown.append(f"datasets[0].type: `{kind}`; map its columns to data.fields by hand")
    known = {"path", "type", "data_files", "ds_type", "split", "chat_template",
             "chat_template_jinja", "roles_to_train", "message_field_role",
             "message_field_content", *CHAT_KEYS}  # fmt: skip
    for key in sorted(set(first) - known):
        out.unknown.append(f"datasets[0].{key}: not carried over")


def _hub_dataset(path: str, entry: dict[str, Any]) -> bool:
    """`org/name` with no file suffix and no local type: what Axolotl fetches from the Hub."""
    if entry.get("ds_type") or entry.get("data_files"):
        return False
    local_suffixes = (".json", ".jsonl", ".ndjson", ".csv", ".tsv", ".tab", ".parquet", ".pq",
                      ".arrow")  # fmt: skip
    return "/" in path and hub_id_form(path) and Path(path).suffix.lower() not in local_suffixes


def render(conversion: Conversion, source: Path) -> str:
    """The campaign as commented YAML: each carried key says which Axolotl key it came from."""
    lines = [
        f"# Converted from the Axolotl config {source} by `tunepilot init --from-axolotl`.",
        "# Check me without training:  tunepilot validate {DIR}/campaign.yaml",
        "# Then state the behaviour to improve and its guards under `hypothesis` (H1, H2).",
    ]
    _emit(conversion.campaign, "", 0, conversion.origin, lines)
    if conversion.unknown:
        lines += ["", "# Not carried over from the Axolotl config:"]
        lines += [f"#   {item}" for item in not_carried_lines(conversion.unknown, source)]
    return "\n".join(lines) + "\n"


SHOWN_NOT_CARRIED = 40


def not_carried_lines(unknown: list[str], source: Path) -> list[str]:
    """The keys not carried over, as the campaign file and the terminal show them: the first
    SHOWN_NOT_CARRIED, then how many more. A machine-written config can hold hundreds of
    thousands of keys; listing each one turned a conversion into minutes and 44 MB of text,
    and the source file already holds them all."""
    shown = unknown[:SHOWN_NOT_CARRIED]
    rest = len(unknown) - len(shown)
    more = ([f"... and {rest:,} more keys with no campaign equivalent (every key of {source} is "
             "still in that file)"] if rest else [])  # fmt: skip
    return [*shown, *more]


def _emit(node: dict[str, Any], prefix: str, depth: int, origin: dict[str, str],
          lines: list[str]) -> None:  # fmt: skip
    pad = "  " * depth
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        note = f"  # {origin[dotted]}" if dotted in origin else ""
        if isinstance(value, dict) and value:
            if depth == 0:
                lines.append("")
            lines.append(f"{pad}{key}:{note}")
            _emit(value, f"{dotted}.", depth + 1, origin, lines)
            continue
        text = json.dumps(value, ensure_ascii=False)  # JSON is YAML, and quotes what needs it
        if isinstance(value, str) and re.fullmatch(r"[\w./:@+-]+", value):
            text = value if not _yaml_special(value) else text
        lines.append(f"{pad}{key}: {text}{note}")


def _yaml_special(text: str) -> bool:
    """Plain words YAML would read as something else (a bool, a number, null)."""
    return not isinstance(yaml.safe_load(text), str)


def write_from_axolotl(
    directory: Path, source: Path, force: bool = False
) -> tuple[Path, list[str]]:
    """Write DIR/campaign.yaml from an Axolotl config; returns the path and the keys not carried.

    The result is validated like any campaign before it is written, so what lands on disk
    loads; a value the campaign refuses (e.g. a learning rate of 2) is an error naming it."""
    from tunepilot.campaign.loading import validate_mapping

    config = read_axolotl(source)
    from tunepilot.campaign.templates import campaign_name_for

    conversion = convert(config, campaign_name_for(directory))
    try:  # everything but the placeholder (which `validate` refuses until it is stated)
        validate_mapping(conversion.stated(), source="converted campaign")
    except InputError as err:
        problems = []
        for p in err.problems:
            key = p.where.removeprefix("converted campaign ")
            came = conversion.origin.get(key)
            where = f"{source} {came}" if came else f"{source} -> {key}"
            problems.append(Problem(where, p.found, p.fix))
        title = "the Axolotl config does not make a valid campaign"
        raise InputError(problems, title=title) from None
    path = Path(directory) / "campaign.yaml"
    if path.exists() and not force:
        raise input_error(str(path), "a campaign file already exists",
                          "choose another folder or pass --force to overwrite it")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(conversion, Path(source)).replace("{DIR}", str(directory)), "utf-8")
    return path, conversion.unknown
