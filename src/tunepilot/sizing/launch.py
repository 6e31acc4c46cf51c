"""`tunepilot plan --emit skypilot`: the rental plan as a SkyPilot task file (L3).

The plan ends with a card and a package; this writes the job an existing engine launches on
that card, so nobody writes a launcher by hand. SkyPilot is the common open-source launcher
across GPU clouds (`sky jobs launch FILE`: a managed job restarts a preempted instance).
What the file holds:

* `resources.accelerators`: the chosen card in SkyPilot's name (`H100:8`), `num_nodes` the
  machines;
* `file_mounts`: the campaign folder on a bucket (`MOUNT_CACHED`: written to local disk
  first, uploaded in the background; SkyPilot's mode for checkpoints), created from the local
  folder on the first launch and reused after a preemption, so the ledger, checkpoints and
  exports outlive the instance; the tunepilot source tree when tunepilot runs from one;
* `setup`: tunepilot installed as the README does on a GPU machine (`make .venv/.installed
  TORCH=torch` in the source tree, else `pip install tunepilot[...]`);
* `run`: the package's phases in order, each one command line of the ordinary CLI. A phase
  that finished leaves a marker under `launch/done/`, so a restarted job goes on where the
  preempted one stopped; a training run continues from its newest checkpoint
  (`tunepilot.sizing.launch_step`, which picks run, resume or skip from the ledger).

Several machines: each training run is one torchrun group over every node, joined by
torchrun's c10d rendezvous at the head node (`--nnodes`, `--rdzv-endpoint` from
SKYPILOT_NODE_IPS); node 0 runs the phases and owns the ledger, the other nodes join each
run's group and write nothing (the worker's rank 0 does).

The phases come in as a list (`LaunchPhase`), the plan's own order; this module knows
SkyPilot's file shape and nothing of how the phases were chosen.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunepilot.data.workspace import Workspace

RDZV_PORT = 29500  # torchrun's default master port, on the head node
# Catalog card -> SkyPilot's accelerator name (`sky show-gpus` lists them); the count is
# the card's GPUs per machine.
SKY_ACCELERATORS = {
    "T4": "T4", "L4": "L4", "A10": "A10", "RTX 4090": "RTX4090", "A100 40GB": "A100",
    "A100 80GB": "A100-80GB", "H100 80GB": "H100", "H200 141GB": "H200",
    "MI300X 192GB": "MI300X",
}  # fmt: skip


@dataclass(frozen=True)
class LaunchPhase:
    """One phase of the package: its name and the shell lines that do it (run in order,
    with the campaign file as $CAMPAIGN)."""

    name: str
    lines: tuple[str, ...]
    per_run: bool = False  # the training runs: launch_step decides run / resume / skip


def sky_accelerator(card_name: str, gpus: int) -> str:
    """`H100:8` for the catalog's `8x H100 80GB`; an unknown card keeps its name."""
    base = re.sub(r"^\d+x\s+", "", card_name.strip())
    return f"{SKY_ACCELERATORS.get(base, base.replace(' ', '-'))}:{gpus}"


def rendezvous_flags(nnodes: int, head: str, rdzv_id: str, port: int = RDZV_PORT) -> list[str]:
    """torchrun's multi-node flags: every node runs them with the same values; c10d hosts
    the rendezvous store on the head node."""
    return [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={head}:{port}",
            f"--rdzv-id={rdzv_id}"]  # fmt: skip


def source_tree() -> Path | None:
    """The tunepilot checkout this process runs from (its pyproject.toml), if any."""
    root = Path(__file__).resolve().parents[3]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "tunepilot"' in pyproject.read_text(encoding="utf-8"):
        return root
    return None


def _setup(source: Path | None, version: str) -> str:
    if source is not None:
        install = ["cd ~/tunepilot-src", "make .venv/.installed TORCH=torch",
                   "ln -sf ~/tunepilot-src/.venv ~/tunepilot-venv"]  # fmt: skip
    else:
        install = ["python3 -m venv ~/tunepilot-venv",
                   f'~/tunepilot-venv/bin/pip install torch "tunepilot[train,trackers]=={version}"']
    return "\n".join(["set -euo pipefail", *install, "~/tunepilot-venv/bin/tunepilot --help"
                      " > /dev/null  # the install imports"]) + "\n"  # fmt: skip


def _run_script(phases: list[LaunchPhase], campaign_file: str, gpus: int, nodes: int) -> str:
    lines = [
        "set -euo pipefail",
        'export PATH="$HOME/tunepilot-venv/bin:$PATH"',
        f"export CAMPAIGN=/campaign/{campaign_file}",
        "DONE=/campaign/launch/done && mkdir -p \"$DONE\"",
        "HEAD=$(echo \"$SKYPILOT_NODE_IPS\" | head -n1)",
        f"export TUNEPILOT_NPROC={gpus} TUNEPILOT_NNODES={nodes} TUNEPILOT_HEAD=\"$HEAD\"",
        "# A phase that finished leaves $DONE/<n>; a restarted (preempted) job skips it.",
        "phase() { [ -e \"$DONE/$1\" ] && { echo \"phase $1 done before\"; return 0; }; "
        "echo \"phase $1: $2\"; shift 2; \"$@\" && touch \"$DONE/$1\"; }",
    ]
    if nodes > 1:
        lines.append("if [ \"$SKYPILOT_NODE_RANK\" != 0 ]; then  # join every run's torchrun group")
        for phase in phases:
            if phase.per_run:
                lines += [f"  {line}" for line in phase.lines]
        lines += ["  exit 0", "fi"]
    for index, phase in enumerate(phases, start=1):
        label = shlex.quote(phase.name)
        if phase.per_run:
            lines.append(f"# {index}. {phase.name} (each run: new, resumed or done)")
            lines += phase.lines
            lines.append(f"touch \"$DONE/{index}\"")
            continue
        for line in phase.lines:
            lines.append(f"phase {index} {label} {line}")
    return "\n".join(lines) + "\n"


def skypilot_task(
    *,
    campaign_name: str,
    campaign_folder: Path,
    campaign_file: str,
    card_name: str,
    gpus: int,
    nodes: int,
    phases: list[LaunchPhase],
    version: str,
    source: Path | None,
) -> dict[str, Any]:
    """The task as a mapping in SkyPilot's task-file shape."""
    bucket = re.sub(r"[^a-z0-9-]+", "-", f"tunepilot-{campaign_name}".lower()).strip("-")[:63]
    mounts: dict[str, Any] = {
        "/campaign": {"name": bucket, "source": str(campaign_folder), "mode": "MOUNT_CACHED"},
    }
    if source is not None:
        mounts["~/tunepilot-src"] = str(source)
    return {
        "name": bucket,
        "resources": {"accelerators": sky_accelerator(card_name, gpus), "disk_size": 256},
        "num_nodes": nodes,
        "envs": {"HF_HOME": "/campaign/.hf-cache", "WANDB_DIR": "/campaign/tracking"},
        "file_mounts": mounts,
        "setup": _setup(source, version),
        "run": _run_script(phases, campaign_file, gpus, nodes),
    }


def task_yaml(task: dict[str, Any], header: list[str]) -> str:
    """The task file's text: a commented header, then the task (block scalars for scripts)."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _text(dumper: yaml.SafeDumper, value: str) -> Any:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _text)
    body = yaml.dump(task, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    return "".join(f"# {line}\n" if line else "#\n" for line in header) + body


def package_phases(campaign: Any, card_name: str) -> list[LaunchPhase]:
    """The package's phases in order, as the CLI runs them: the pilot again on the rented card
    (B1: a new platform redoes start-up and quality checks), the baseline (H3), every variant
    x seed (V1-V6), the comparison, the export of what it decided and its verification in a
    new process (R2), and the dossier."""
    from tunepilot.campaign.variants import variant_names

    step = "python -m tunepilot.sizing.launch_step"
    runs = tuple(f'{step} run "$CAMPAIGN" {shlex.quote(v)} {s}'
                 for v in variant_names(campaign) for s in campaign.seeds)  # fmt: skip
    deliver = f'"$({step} target "$CAMPAIGN")"'
    return [
        LaunchPhase("re-pilot on this card",
                    (f'tunepilot pilot "$CAMPAIGN" --gpu {shlex.quote(card_name)}',)),
        LaunchPhase("baseline", ('tunepilot baseline "$CAMPAIGN"',)),
        LaunchPhase("runs", runs, per_run=True),
        LaunchPhase("compare", ('tunepilot compare "$CAMPAIGN"',)),
        LaunchPhase("export", (f'tunepilot export {deliver} "$CAMPAIGN"',)),
        LaunchPhase("verify", (f'tunepilot verify "/campaign/exports/"{deliver}',)),
        LaunchPhase("report", ('tunepilot report "$CAMPAIGN"',)),
    ]


def emit_skypilot(ws: Workspace, plan: dict[str, Any], catalog: Path | None, nodes: int) -> Path:
    """Write `<campaign>/launch/skypilot.yaml` for the plan's card: the target, else the
    recommendation (L3). No card that fits is bad input: there is nothing to launch."""
    from tunepilot import __version__
    from tunepilot.console import error_console
    from tunepilot.errors import input_error, write_text_atomic
    from tunepilot.sizing.catalog import load_catalog

    name = plan.get("target") or plan.get("recommendation")
    if plan.get("fits") is False:
        raise input_error("--emit skypilot", f"the {name or 'planned card'} does not fit this "
                          "campaign (see the nearest change above)",
                          "apply the nearest change, or pass --gpu with a card that fits")
    if not name:
        raise input_error("--emit skypilot", "no card of the catalog fits this campaign",
                          "pass --gpu with a card that fits (see the sheet above)")  # fmt: skip
    card = load_catalog(catalog).card(name)
    task = skypilot_task(
        campaign_name=ws.campaign.name, campaign_folder=ws.root.resolve(),
        campaign_file=ws.campaign_file.name, card_name=card.name, gpus=card.gpus, nodes=nodes,
        phases=package_phases(ws.campaign, card.name), version=__version__,
        source=source_tree(),
    )  # fmt: skip
    header = [f"SkyPilot task for the campaign {ws.campaign.name}, written by `tunepilot plan "
              f"--emit skypilot` for {nodes} x {card.name}.",
              f"Launch:  sky jobs launch {ws.root / 'launch' / 'skypilot.yaml'}",
              "A managed job restarts a preempted instance; the phases done are skipped and a",
              "run continues from its newest checkpoint (the campaign folder lives on the",
              "bucket below). Plan: " + str(plan.get("sentence", "")), ""]  # fmt: skip
    path = ws.root / "launch" / "skypilot.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, task_yaml(task, header))
    error_console.print(f"launcher job written: {path} (sky jobs launch {path})",
                        highlight=False, soft_wrap=True)  # fmt: skip
    return path
