"""Training checkpoints that resume exactly and load safely (R1, R4).

A weights-only save serves inference; resuming also needs the optimizer, the scheduler
position, the data position and the generators (R1). One checkpoint is one folder:

    runs/<id>/checkpoints/step-000200/
        adapter_model.safetensors + adapter_config.json   (LoRA, in PEFT's own format)
        or model.safetensors                              (full fine-tune)
        optimizer.safetensors   AdamW tensors as "state.<param index>.<name>"
        optimizer.json          param groups and any non-tensor optimizer state
        rng.safetensors         torch CPU (and CUDA) generator states (ranks > 0: "rank<r>.")
        state.json              update, sampler position, seed, hashes, Python/NumPy RNG
        MANIFEST.json           sha256 and size of every other file

It is written into a hidden temporary folder and renamed into place, so a crash (even
SIGKILL) leaves either the whole checkpoint or none of it; older folders are deleted only
after the new one is in place. Loading verifies the manifest first and refuses anything that
is, or looks like, a pickle: a checkpoint is never a way to run someone else's code (R4).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunepilot.campaign import stable_hash
from tunepilot.errors import InputError, Problem, input_error, reading, writing
from tunepilot.train import rng
from tunepilot.train.manifest import (
    FORMAT,
    fsync_dir,
    read_tensors,
    refusing,
    verify_checkpoint,
    write_json,
    write_manifest,
)
from tunepilot.train.optimizer import optimizer_files, read_optimizer_files

if TYPE_CHECKING:
    import torch

STEP_PREFIX = "step-"
NOT_TRAJECTORY = {
    "eval_every",
    "eval_batch_size",
    "checkpoint_every",
    "keep_last_checkpoints",
    "stop",
    "max_new_tokens",
}
"""Settings that may change on resume: they do not change which updates are applied."""
_PEFT_WEIGHTS = "adapter_model.safetensors"
_FULL_WEIGHTS = "model.safetensors"


def step_folder(run_dir: Path, update: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{STEP_PREFIX}{update:06d}"


def _step_of(folder: Path) -> int | None:
    name = folder.name
    if not name.startswith(STEP_PREFIX) or not name[len(STEP_PREFIX) :].isdigit():
        return None
    return int(name[len(STEP_PREFIX) :])


def unwrap(model: Any) -> Any:
    """The model under a DDP wrapper (DDP keeps it in `.module` and has `no_sync`)."""
    return model.module if hasattr(model, "no_sync") and hasattr(model, "module") else model


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


# ---------------------------------------------------------------------------------------------
# saving
# ---------------------------------------------------------------------------------------------


def save_checkpoint(
    run_dir: Path,
    update: int,
    model: Any,
    optimizer: torch.optim.Optimizer,
    sampler_state: dict[str, Any],
    extra: dict[str, Any],
    keep_last: int,
    rng_states: Sequence[rng.Captured] | None = None,
) -> Path:
    """Write the full training state after `update` updates; returns the step folder.

    `rng_states`: every rank's generators (`rng.gather`) under data replicas; None saves
    this process's own.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a save that was killed half-way
        shutil.rmtree(stale, ignore_errors=True)
    final = step_folder(run_dir, update)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"

    def write() -> None:
        from safetensors.torch import save_file, save_model

        # Weights: an adapter in PEFT's own format so `PeftModel.from_pretrained` reads it as is.
        inner = unwrap(model)
        if _is_peft(inner):
            embeddings = embedding_layers_to_save(inner)
            inner.save_pretrained(str(tmp), safe_serialization=True,
                                  save_embedding_layers=embeddings)  # fmt: skip
            # PEFT's model card names the base by its absolute path; a checkpoint needs no card.
            (tmp / "README.md").unlink(missing_ok=True)
        else:
            save_model(inner, str(tmp / _FULL_WEIGHTS))  # handles tied weights, unlike save_file

        tensors, opt_json = optimizer_files(optimizer.state_dict())
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        write_json(tmp / "optimizer.json", opt_json)

        rng_json, rng_tensors = rng.to_files(rng_states or [rng.capture()])
        save_file(rng_tensors, str(tmp / "rng.safetensors"))
        state = {
            "format": FORMAT,
            "update": update,
            "scheduler_step": update,  # the lr is a pure function of this (schedule.py)
            "sampler": sampler_state,
            **rng_json,
            "weights": "peft" if _is_peft(inner) else "full",
            **extra,
        }
        write_json(tmp / "state.json", state)
        write_manifest(tmp)

    # A full disk or a file-size limit is a sentence naming the folder and the size, and
    # leaves no half-written folder behind (the previous checkpoints stay).
    try:
        with writing(tmp, _state_bytes(model, optimizer)):
            tmp.mkdir()
            write()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    # Rename into place. A folder of the same step (a resume from an earlier step that
    # reaches it again) is moved aside first: os.replace cannot replace a non-empty folder.
    if final.exists():
        aside = root / f".tmp-old-{final.name}-{os.getpid()}"
        os.replace(final, aside)
        os.replace(tmp, final)
        shutil.rmtree(aside)
    else:
        os.replace(tmp, final)
    fsync_dir(root)
    _keep_last(root, update, keep_last)
    return final


def embedding_layers_to_save(model: Any) -> bool | str:
    """PEFT's `save_embedding_layers`: its own "auto" when LoRA targets an embedding, else
    False. tunepilot never resizes a vocabulary, and "auto" would then ask the Hub for the
    base's config.json on every save (the adapter names its base by the campaign's relative
    name, which is no local folder from here): a network call per checkpoint."""
    from peft.utils.constants import EMBEDDING_LAYER_NAMES

    targeted = any(name in (c.target_modules or ()) for c in model.peft_config.values()
                   for name in EMBEDDING_LAYER_NAMES)  # PEFT's own test (a set, or a regex)
    return "auto" if targeted else False


def _state_bytes(model: Any, optimizer: torch.optim.Optimizer) -> int:
    """About what a checkpoint writes: the weights saved plus the optimizer's tensors."""
    import torch

    inner = unwrap(model)
    if isinstance(inner, torch.nn.Module):
        saved = [p for p in inner.parameters() if p.requires_grad or not _is_peft(inner)]
    else:  # the gathered stand-in of a sharded model (sharded.py): it writes its state dict
        saved = [v for v in inner.state_dict().values() if isinstance(v, torch.Tensor)]
    weights = sum(p.numel() * p.element_size() for p in saved)
    state = sum(
        v.numel() * v.element_size()
        for per_param in optimizer.state_dict()["state"].values()
        for v in per_param.values()
        if isinstance(v, torch.Tensor)
    )
    return weights + state


def _keep_last(root: Path, newest: int, keep_last: int) -> None:
    """Delete older step folders beyond `keep_last`, never the one just written.

    Folders of later steps (left by a run that was resumed from an earlier checkpoint) are
    not counted and not touched.
    """
    older = sorted(
        (step, p) for p in root.iterdir() if (step := _step_of(p)) is not None and step < newest
    )
    for _, path in older[: max(0, len(older) - (keep_last - 1))]:
        shutil.rmtree(path)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The highest complete step folder of a run (one with a MANIFEST.json), or None."""
    done = [p for p in step_folders(run_dir) if (p / "MANIFEST.json").is_file()]
    return done[0] if done else None


def step_folders(run_dir: Path) -> list[Path]:
    """Every step folder of a run, complete or not, newest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    steps = [(step, p) for p in root.iterdir() if (step := _step_of(p)) is not None]
    return [p for _, p in sorted(steps, reverse=True)]


def run_identity(settings: Any, data: Sequence[Any]) -> dict[str, str]:
    """What a checkpoint must share with the run that resumes it.

    The settings hash leaves out what does not change the trajectory (evaluate more often,
    allow more wall clock); the data version hashes exactly what the model is trained on.
    """
    dumped = settings.model_dump(mode="json")
    digest = hashlib.sha256()
    for e in data:
        digest.update(e.example_id.encode("utf-8") + b"\0")
        digest.update(array("q", e.input_ids).tobytes() + b"\1")
        digest.update(array("q", e.labels).tobytes() + b"\2")
        if e.pixel_values is not None:  # an image example's input is its pixels
            digest.update(e.pixel_values.contiguous().numpy().tobytes())
    return {
        "settings_hash": stable_hash({k: v for k, v in dumped.items() if k not in NOT_TRAJECTORY}),
        "data_version": digest.hexdigest()[:16],
    }


def check_identity(folder: Path, state: dict[str, Any], identity: dict[str, str]) -> None:
    """Refuse to continue a checkpoint with other settings or other data (a new experiment)."""
    problems = [
        Problem(
            f"{folder}/state.json {key}",
            f"{state.get(key)} in the checkpoint, {now} now",
            "resume with the same training settings and data, or start a new run",
        )
        for key, now in identity.items()
        if state.get(key) != now
    ]
    if problems:
        raise InputError(problems, title="the checkpoint belongs to another experiment")


# ---------------------------------------------------------------------------------------------
# verifying and loading
# ---------------------------------------------------------------------------------------------


STATE_FIX = "resume from another checkpoint of the run, or retry it (`tunepilot run --retry RUN`)"


def read_state(folder: Path) -> dict[str, Any]:
    """state.json of a verified step folder, refused as bad input when it is not the object
    save_checkpoint writes (a damaged or hand-edited file never reaches the loop as is)."""
    path = Path(folder) / "state.json"
    with refusing(path, "checkpoint state", STATE_FIX):  # resume falls back past it
        state = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(state, dict):
            raise TypeError(f"a JSON {type(state).__name__}, not an object")
        missing = [k for k in ("update", "sampler", "weights") if k not in state]
        if missing:
            raise KeyError(f"no {', '.join(missing)}")
    return state


def restore_position(
    folder: Path, state: dict[str, Any], sampler: Any, scaler: Any
) -> tuple[int, int, float]:
    """Put the sampler (and the fp16 gradient scaler) back where the checkpoint left them, so
    training continues at that position without replaying a batch; returns (updates done,
    examples seen, seconds trained). A state.json whose entries do not fit is bad input."""
    state_file = folder / "state.json"
    with reading(state_file, STATE_FIX, what="checkpoint state", title="checkpoint refused"):
        sampler.load_state_dict(state["sampler"])
        if scaler is not None and state.get("grad_scaler"):
            scaler.load_state_dict(state["grad_scaler"])
        return int(state["update"]), int(state["examples_seen"]), float(state["elapsed_seconds"])


def load_weights(folder: Path, model: Any) -> dict[str, Any]:
    """Verify the manifest, then load only the weights (adapter or full model) in place.

    What inference, export and the sealed test need; resuming also needs `load_checkpoint`.
    Returns state.json.
    """
    folder = Path(folder)
    verify_checkpoint(folder)
    return _load_verified_weights(folder, model, read_state(folder))


def _load_verified_weights(folder: Path, model: Any, state: dict[str, Any]) -> dict[str, Any]:
    from safetensors.torch import load_model

    inner = unwrap(model)
    if state.get("weights") == "peft":
        _load_adapter(folder, inner)
    else:
        path = folder / _FULL_WEIGHTS
        try:
            with refusing(path, "safetensors file"):  # a truncated file is a refusal
                missing, unexpected = load_model(inner, str(path), strict=False)
        except RuntimeError as exc:  # shape mismatches; keep the first line, not the wall
            _refuse_key_mismatch(path, [], [], str(exc).strip().splitlines()[-1].strip())
        _refuse_key_mismatch(path, missing, unexpected)
    return state


def load_checkpoint(folder: Path, model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Verify, then load weights and optimizer state in place; returns state.json.

    Every file is read before the model changes, so a refused one (manifest.refusing) leaves
    the model as it was for the fallback. The RNG tensors are returned under
    `state["rng_tensors"]`; the caller restores the generators last, once everything that may
    consume randomness is built.
    """
    folder = Path(folder)
    verify_checkpoint(folder)
    state = read_state(folder)
    per_param, groups = read_optimizer_files(folder)
    rng_tensors = read_tensors(folder / "rng.safetensors")
    _load_verified_weights(folder, model, state)
    try:
        optimizer.load_state_dict({"state": per_param, "param_groups": groups})
    except ValueError as exc:
        raise input_error(
            str(folder / "optimizer.json"),
            f"optimizer state does not fit this model's trainable parameters ({exc})",
            "resume with the same model, adapter settings and trainable modules",
            title="checkpoint does not match the model",
        ) from None
    state["rng_tensors"] = rng_tensors
    return state


def _load_adapter(folder: Path, model: Any) -> None:
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    if not _is_peft(model):
        raise input_error(
            str(folder),
            "a LoRA adapter checkpoint, but the model has no adapter",
            "wrap the base model with the same LoRA settings before resuming",
            title="checkpoint does not match the model",
        )
    saved = read_tensors(folder / _PEFT_WEIGHTS)
    saved_by_peft = get_peft_model_state_dict(
        model, save_embedding_layers=embedding_layers_to_save(model))
    expected = {k: tuple(v.shape) for k, v in saved_by_peft.items()}
    shapes = [
        f"{k} {tuple(v.shape)} saved, {expected[k]} now"
        for k, v in saved.items()
        if k in expected and tuple(v.shape) != expected[k]
    ]
    _refuse_key_mismatch(
        folder / _PEFT_WEIGHTS,
        sorted(expected.keys() - saved.keys()),
        sorted(saved.keys() - expected.keys()),
        f"{len(shapes)} shapes differ (e.g. {shapes[0]})" if shapes else "",
    )
    set_peft_model_state_dict(model, saved)


def _refuse_key_mismatch(
    path: Path, missing: list[str], unexpected: list[str], shapes: str = ""
) -> None:
    """One sentence with counts and a few names, instead of a wall of keys (STYLE 11)."""
    if not missing and not unexpected and not shapes:
        return
    parts = [shapes] if shapes else []
    if missing:
        parts.append(f"{len(missing)} weights missing (e.g. {', '.join(missing[:3])})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
    raise input_error(
        str(path),
        "; ".join(parts),
        "resume with the same base model and adapter settings that wrote it",
        title="checkpoint does not match the model",
    )
