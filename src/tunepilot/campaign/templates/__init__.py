"""Commented campaign files for `tunepilot init`, one per task kind."""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

from tunepilot.errors import input_error, write_text_atomic

TASKS = ("classification", "extraction", "format", "image_classification", "chat")


def template_text(task: str) -> str:
    if task not in TASKS:
        raise input_error("--task", f"unknown task `{task}`", f"use one of {', '.join(TASKS)}")
    folder = files("tunepilot.campaign.templates")
    return folder.joinpath(f"{task}.yaml").read_text(encoding="utf-8")


def campaign_name_for(directory: Path) -> str:
    """A new campaign is named after its folder (what becomes the MLflow experiment, the W&B
    project, the dossier's title), in the letters a name may hold."""
    name = Path(directory).resolve().name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "campaign"


def write_template(directory: Path, task: str, force: bool = False) -> Path:
    """Write DIR/campaign.yaml named after DIR; refuse to overwrite a user's file unless asked."""
    text = re.sub(r"(?m)^name: \S+", f"name: {campaign_name_for(directory)}", template_text(task),
                  count=1)  # fmt: skip
    path = Path(directory) / "campaign.yaml"
    if path.exists() and not force:
        raise input_error(
            str(path),
            "a campaign file already exists",
            "choose another folder or pass --force to overwrite it",
        )
    write_text_atomic(path, text.replace("{DIR}", str(directory)))
    return path
