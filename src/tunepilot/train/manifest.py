"""A checkpoint folder's manifest (R4): every file's sha256 and size written last, checked
first; only safetensors and JSON/text are accepted, and a pickle is refused by suffix or by its
bytes without ever being opened as one (`deliver/bundle_check.py`: the rule bundles follow too).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tunepilot.deliver import bundle_check
from tunepilot.errors import InputError, Problem, reading
from tunepilot.model.base import sha256_file

FORMAT = "tunepilot-checkpoint/1"
TEXT_SUFFIXES = (".json", ".md", ".txt")


class CheckpointRefused(InputError):
    """A checkpoint that does not verify: missing or unreadable manifest, a changed, missing
    or unsafe file. Resume may fall back to an older checkpoint on this error (and on no
    other: a checkpoint that verifies but does not fit the model is the user's to fix)."""


REFUSED_FIX = "resume from another step folder (`tunepilot resume RUN --from step-N`)"


@contextmanager
def refusing(path: Path, what: str, fix: str = REFUSED_FIX) -> Iterator[None]:
    """Read a checkpoint file inside the block; what its content raises is a refusal.

    Bad JSON, a missing entry, or a truncated safetensors file whose MANIFEST.json was
    rewritten to match: the checkpoint does not verify in the sense that matters, so resume
    falls back past it (loudly), and nothing reaches the user as a traceback. Keep the block
    to reading and parsing, before anything is loaded into a model."""
    from safetensors import SafetensorError

    try:
        with reading(path, fix, what=what, title="checkpoint refused", also=(SafetensorError,)):
            yield
    except CheckpointRefused:
        raise
    except InputError as exc:
        raise CheckpointRefused(exc.problems, title=exc.title) from None


def read_tensors(path: Path) -> dict[str, Any]:
    """A checkpoint's safetensors file as torch tensors, refused when it cannot be read."""
    from safetensors.torch import load_file

    with refusing(path, "safetensors file"):
        return load_file(str(path))


def write_json(path: Path, obj: Any) -> None:
    with path.open("w", encoding="utf-8") as handle:
        json.dump(obj, handle, indent=1, sort_keys=True, allow_nan=False)
        handle.flush()
        os.fsync(handle.fileno())


def write_manifest(folder: Path, fmt: str = FORMAT) -> dict[str, Any]:
    """Hash every file of `folder` into MANIFEST.json (checkpoints and export bundles)."""
    files = {
        str(p.relative_to(folder)): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
    for name in files:  # the data must be on disk before the rename makes it visible
        with (folder / name).open("rb") as handle:
            os.fsync(handle.fileno())
    manifest = {"format": fmt, "files": files}
    write_json(folder / "MANIFEST.json", manifest)
    return manifest


def manifest_digest(folder: Path) -> str:
    """A checkpoint's or a bundle's pin: sha256 of its MANIFEST.json, which holds every other
    file's sha256.

    The MANIFEST alone proves files were not damaged since it was written, not who wrote it:
    whoever can edit the weights can rewrite it. This digest, recorded where the folder was
    written (printed at export and kept in the ledger), is what a colleague compares
    (`tunepilot verify DIR --expect SHA`, `tunepilot resume RUN --expect SHA`)."""
    import hashlib

    return hashlib.sha256((Path(folder) / "MANIFEST.json").read_bytes()).hexdigest()


def parse_pin(text: str, fix: str) -> str:
    """A pinned digest as given to `--expect`: 64 hex digits, lower-cased; anything else (a
    cut-off paste, a typo) is bad input naming --expect, never a FAIL blaming the folder."""
    import re

    if not re.fullmatch(r"[0-9a-fA-F]{64}", text.strip()):
        raise InputError([Problem("--expect", f"`{text}` is not a sha256 (64 hex digits)", fix)],
                         title="invalid input")  # fmt: skip
    return text.strip().lower()


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unsafe_reason(path: Path) -> str | None:
    """Why a checkpoint file must not be read, or None: the rule bundles follow too
    (`deliver/bundle_check.py`), with the types a checkpoint holds besides safetensors."""
    return bundle_check.unsafe_reason(path, TEXT_SUFFIXES)


def verify_checkpoint(folder: Path) -> dict[str, Any]:
    """Check the manifest and refuse pickles; every problem is reported together (R4)."""
    folder = Path(folder)
    manifest_path = folder / "MANIFEST.json"
    if not manifest_path.is_file():
        raise CheckpointRefused(
            [Problem(str(manifest_path), "no MANIFEST.json (an incomplete or foreign checkpoint)",
                     REFUSED_FIX)],
            title="checkpoint refused",
        )
    with refusing(manifest_path, "manifest"):  # resume may fall back past it too
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        listed: dict[str, tuple[int, str]] = {  # every entry whole before any is judged
            str(name): (int(entry["bytes"]), str(entry["sha256"]))
            for name, entry in dict(manifest["files"]).items()
        }
    problems: list[Problem] = []
    present = {
        str(p.relative_to(folder)): p
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p != manifest_path
    }
    for name, path in present.items():
        reason = unsafe_reason(path)
        if reason:
            problems.append(
                Problem(str(path), reason, "delete it; never load files of unknown origin")
            )
        elif name not in listed:
            problems.append(Problem(str(path), "a file not listed in MANIFEST.json", "remove it"))
    for name, (size, digest) in listed.items():
        path = folder / name
        if name not in present:
            problems.append(
                Problem(
                    str(path),
                    "listed in MANIFEST.json but missing",
                    "restore the file or resume from another checkpoint",
                )
            )
        elif path.stat().st_size != size or sha256_file(path) != digest:
            problems.append(
                Problem(
                    str(path),
                    "sha256 differs from MANIFEST.json (corrupted or edited)",
                    "resume from another checkpoint; never edit a checkpoint in place",
                )
            )
    if problems:
        raise CheckpointRefused(problems, title=f"checkpoint {folder} refused")
    return manifest
