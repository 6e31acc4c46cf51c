"""Which checkpoint a resume starts from (R1): the newest that verifies, or the one asked for.

A checkpoint whose files changed or went missing is refused by its manifest (R4). Resume then
falls back to the newest older one that verifies and says so out loud, because every update
after it will be trained again; `tunepilot resume RUN --from step-N` picks one explicitly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunepilot.errors import input_error
from tunepilot.train.checkpoint import STEP_PREFIX, step_folders
from tunepilot.train.manifest import CheckpointRefused, fsync_dir

REFUSED_PREFIX = "refused-"
"""A refused checkpoint set aside: kept for inspection, never a step folder again."""


def _is_step(folder: Path) -> bool:
    return folder.name.startswith(STEP_PREFIX) and folder.name[len(STEP_PREFIX):].isdigit()


def parse_step(text: str) -> int:
    """`step-8`, `step-000008` or `8` -> 8 (what `tunepilot resume RUN --from` accepts)."""
    digits = text.strip().removeprefix(STEP_PREFIX)
    if not digits.isdigit():
        raise input_error("--from", repr(text), "give a step folder name such as step-000008")
    return int(digits)


def load_resumable(
    folder: Path, load: Callable[[Path], dict[str, Any]]
) -> tuple[Path, dict[str, Any], list[str]]:
    """Load the checkpoint to resume from: `folder` itself when it is a step folder, else the
    newest step folder of the run `folder` that verifies.

    Returns (step folder, state, refusals): each newer checkpoint that failed verification
    with the reason, for the caller to say out loud. Only a failed verification falls back;
    a checkpoint that verifies but does not fit the model is an error. `load` verifies before
    it changes anything, so a refused checkpoint leaves the model untouched.
    """
    folder = Path(folder)
    explicit = _is_step(folder)
    candidates = [folder] if explicit else step_folders(folder)
    if explicit and not folder.is_dir():
        have = ", ".join(p.name for p in step_folders(folder.parent.parent)) or "none"
        raise input_error(str(folder), "no such checkpoint", f"use one of: {have}",
                          title="nothing to resume")  # fmt: skip
    refused: list[str] = []
    for candidate in candidates:
        try:
            return candidate, load(candidate), refused
        except CheckpointRefused as exc:
            if explicit:
                raise
            problem = exc.problems[0]
            refused.append(f"{candidate.name} refused: {problem.found} ({problem.where})")
    raise input_error(
        str(folder / "checkpoints"),
        "no checkpoint that verifies" + (f" ({'; '.join(refused)})" if refused else
                                          " (the run stopped before its first checkpoint)"),
        ("restore or remove what each refusal names (a pickle never belongs in a checkpoint) "
         "and resume again, or start the run again as a new attempt (`tunepilot run CAMPAIGN "
         "--retry RUN`)") if refused else
        "start the run again as a new attempt (`tunepilot run CAMPAIGN --retry RUN`)",
        title="nothing to resume",
    )  # fmt: skip


def set_aside_newer(run_dir: Path, resumed: Path) -> None:
    """Rename the step folders newer than `resumed` to `refused-step-N`.

    Called once a resume fell back past them (they did not verify) and before the first new
    checkpoint: otherwise `keep_last_checkpoints` would count a broken newer folder and delete
    the good one the run resumed from, leaving nothing that verifies. Nothing is deleted: the
    folders stay for inspection, named so that no resume tries them again.
    """
    moved: list[Path] = []
    resumed_step = parse_step(resumed.name)
    for folder in step_folders(run_dir):
        if parse_step(folder.name) <= resumed_step:
            continue
        target = folder.with_name(REFUSED_PREFIX + folder.name)
        n = 1
        while target.exists():
            n += 1
            target = folder.with_name(f"{REFUSED_PREFIX}{folder.name}-{n}")
        folder.rename(target)
        moved.append(target)
    if moved:
        fsync_dir(moved[0].parent)
