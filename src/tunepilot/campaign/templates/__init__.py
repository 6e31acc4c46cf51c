"""Commented campaign files for `tunepilot init`, one per task kind."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from tunepilot.errors import input_error, write_text_atomic

TASKS = ("classification", "extraction", "format", "image_classification", "chat")


def template_text(task: str) -> str:
    if task not in TASKS:
        raise input_error("--task", f"unknown task `{task}`", f"use one of {', '.join(TASKS)}")
    folder = files("tunepilot.campaign.templates")
    return folder.joinpath(f"{task}.yaml").read_text(encoding="utf-8")


def write_template(directory: Path, task: str, force: bool = False) -> Path:
    """Write DIR/campaign.yaml; refuse to overwrite a user's file unless asked."""
    text = template_text(task)
    path = Path(directory) / "campaign.yaml"
    if path.exists() and not force:
        raise input_error(
            str(path),
            "a campaign file already exists",
            "choose another folder or pass --force to overwrite it",
        )
    write_text_atomic(path, text.replace("{DIR}", str(directory)))
    return path
