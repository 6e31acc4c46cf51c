"""Checkpoints of sharded state (B4, R1): gathered to the single-process format on save,
re-sharded for the mesh on load.

Checkpoints of sharded state use the single-process format (checkpoint.py): the full weights
(adapter in PEFT's format, or model.safetensors) and the full, unsharded optimizer state keyed
by parameter index, exactly as one process writes them. What that buys and what it does not:

* The weights load on any world size and in a single process (export, the sealed test,
  `runner.load_trained_model`), with the ordinary `checkpoint.load_weights`.
* The optimizer state is complete too (it loads into one process with the ordinary
  `load_checkpoint`, tested), and `load_gathered_checkpoint` re-shards it for the mesh it is
  loaded on. Training is still refused on a different world size: the examples of each
  update are split over the ranks and the examples per update are microbatch x accumulation
  x replicas (S7), so another world size is another experiment. `training.distributed` is
  part of the run's settings hash (the loop's identity check refuses), and
  `jobs.resume_distributed` refuses first with both world sizes named. Start a new run from
  the weights instead.
* Exactness of a resume with replicas (R1): every rank draws its own dropout masks, so every
  rank joins the checkpoint to send its generators to rank 0 (`rng.gather`), the files hold
  them all, and on resume each rank reads the checkpoint itself and restores its own
  (`rng.of_rank`). With LoRA dropout 0.1, DDP and FSDP2 alike, 3 updates + a resume in new
  processes give the bit-identical curve and adapter of 6 uninterrupted updates on CPU
  (tests/test_distributed.py); saving rank 0's alone had put the curves ~1e-3 apart in loss.
  A checkpoint written before this keeps loading: ranks > 0 then restart from a derived seed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunepilot.errors import input_error
from tunepilot.train.checkpoint import (
    embedding_layers_to_save,
    read_state,
    save_checkpoint,
    step_folder,
    verify_checkpoint,
)
from tunepilot.train.manifest import read_tensors
from tunepilot.train.optimizer import read_optimizer_files

if TYPE_CHECKING:
    import torch


def save_gathered_checkpoint(
    run_dir: Path, update: int, model: Any, optimizer: torch.optim.Optimizer, *state: Any
) -> Path:
    """`checkpoint.save_checkpoint` for an FSDP2 model: a collective every rank calls.

    `state` is the rest of `save_checkpoint`'s arguments (sampler state, extra, keep_last,
    every rank's generators), passed on unchanged.

    The full weights and optimizer state are gathered to rank 0 (CPU), which writes the
    single-process format; the others wait at a barrier so that no rank runs ahead of a
    checkpoint that is not in place yet. Returns the step folder on every rank.
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    # An adapter needs only the trainable tensors, unless PEFT also saves a frozen embedding;
    # a full fine-tune saves everything.
    frozen_too = True
    if _is_peft(model):
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        frozen_too = not set(_adapter_fqns(model).values()) <= trainable
    weights = get_model_state_dict(
        model,
        options=StateDictOptions(
            full_state_dict=True, cpu_offload=True, ignore_frozen_params=not frozen_too
        ),
    )
    optim = get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if dist.get_rank() == 0:
        view = _GatheredModel(model, _share_tied(model, weights))
        order = _param_order(model, optimizer)
        save_checkpoint(
            run_dir, update, view, _GatheredOptimizer(_by_index(optim, order)),  # type: ignore[arg-type]
            *state,
        )  # fmt: skip
    dist.barrier()
    return step_folder(run_dir, update)


def load_gathered_checkpoint(
    folder: Path, model: Any, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """`checkpoint.load_checkpoint` for an FSDP2 model: every rank verifies the manifest,
    reads the full tensors and keeps its shard. Returns state.json (+ "rng_tensors"). Every
    file is read before the model changes, so a refused one leaves it for the fallback."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    folder = Path(folder)
    verify_checkpoint(folder)
    state = read_state(folder)
    if state.get("weights") == "peft":
        if not _is_peft(model):
            raise input_error(
                str(folder), "a LoRA adapter checkpoint, but the model has no adapter",
                "wrap the base model with the same LoRA settings before resuming",
                title="checkpoint does not match the model",
            )  # fmt: skip
        path = folder / "adapter_model.safetensors"
        saved, names = read_tensors(path), _adapter_fqns(model)
        _refuse_mismatch(path, sorted(names.keys() - saved.keys()), sorted(saved.keys() - names))
        weights = {names[key]: value for key, value in saved.items()}
    else:
        weights = read_tensors(folder / "model.safetensors")
    by_index, saved_groups = read_optimizer_files(folder)
    rng_tensors = read_tensors(folder / "rng.safetensors")
    set_model_state_dict(
        model, weights, options=StateDictOptions(full_state_dict=True, strict=False)
    )

    order = _param_order(model, optimizer)
    per_param = {order[index]: values for index, values in by_index.items()}
    groups = [dict(group, params=[order[i] for i in group["params"]]) for group in saved_groups]
    set_optimizer_state_dict(
        model, optimizer, {"state": per_param, "param_groups": groups},
        options=StateDictOptions(full_state_dict=True),
    )  # fmt: skip
    state["rng_tensors"] = rng_tensors
    return state


class _GatheredModel:
    """Rank 0's stand-in for a sharded model in `save_checkpoint`: the same files as one
    process would write, from the gathered full state dict."""

    def __init__(self, model: Any, state: dict[str, Any]) -> None:
        self._model, self._state = model, state
        if _is_peft(model):
            self.peft_config = model.peft_config
            self.get_base_model = model.get_base_model

    def save_pretrained(self, folder: str, safe_serialization: bool = True, **kw: Any) -> None:
        self._model.save_pretrained(
            folder, safe_serialization=safe_serialization, state_dict=self._state, **kw
        )

    def state_dict(self) -> dict[str, Any]:  # safetensors.save_model for a full fine-tune
        return dict(self._state)


class _GatheredOptimizer:
    """What `save_checkpoint` asks of an optimizer: its single-process `state_dict()`."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _param_order(model: Any, optimizer: Any) -> list[str]:
    """Parameter names in the optimizer's order: position i is index i of `state_dict()`."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _by_index(state: dict[str, Any], order: list[str]) -> dict[str, Any]:
    """A name-keyed full optimizer state dict in `Optimizer.state_dict()`'s index form."""
    index = {name: i for i, name in enumerate(order)}
    groups = [dict(g, params=[index[name] for name in g["params"]]) for g in state["param_groups"]]
    return {"state": {index[k]: v for k, v in state["state"].items()}, "param_groups": groups}


def _share_tied(model: Any, state: dict[str, Any]) -> dict[str, Any]:
    """Tied weights gathered as separate copies are made one tensor again, so that
    `safetensors.save_model` drops the same duplicate names as a single process does."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    out = dict(state)
    for names in groups.values():
        present = [n for n in names if n in out]
        for name in names[1:] if present else []:
            out[name] = out[present[0]]
    return out


def _adapter_fqns(model: Any) -> dict[str, str]:
    """Adapter-file key (PEFT's, adapter name removed) -> the model's parameter name.

    Asks PEFT itself: a state dict of index placeholders goes through
    `get_peft_model_state_dict`, so its renaming rules (LoRA, modules_to_save, embeddings)
    are never re-implemented here.
    """
    import torch
    from peft import get_peft_model_state_dict

    names = list(model.state_dict().keys())
    placeholders = {name: torch.tensor(i) for i, name in enumerate(names)}
    picked = get_peft_model_state_dict(model, state_dict=placeholders,
                                       save_embedding_layers=embedding_layers_to_save(model))
    return {key: names[int(value)] for key, value in picked.items()}


def _refuse_mismatch(path: Path, missing: Iterable[str], unexpected: Iterable[str]) -> None:
    missing, unexpected = list(missing), list(unexpected)
    if not missing and not unexpected:
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} weights missing (e.g. {', '.join(missing[:3])})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
    raise input_error(
        str(path), "; ".join(parts),
        "resume with the same base model and adapter settings that wrote it",
        title="checkpoint does not match the model",
    )  # fmt: skip
