"""How a run ends and how it goes on (R1, V3): the resume point, the reason recorded for an
ending, and the command that continues it.

A run that stopped on a refusal (a checkpoint that does not verify, bad input) or a storage
fault (a full disk, a file-size limit) is the campaign's to fix, not a failed experiment: it is
recorded `interrupted`, with the error and the command that continues it once fixed. Every
piece of advice names something that exists: `resume` when a checkpoint does, `run --retry`
when none was saved.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tunepilot.data.workspace import Workspace


def resume_source(ws: Workspace, run_id: str, run_dir: Path, from_step: int | None) -> Path:
    """The folder `train` resumes from: the step asked for, or the run folder (its newest
    checkpoint that verifies). A run with no checkpoint gets advice that works."""
    from tunepilot.errors import input_error
    from tunepilot.train.checkpoint import step_folder, step_folders

    if from_step is not None:
        return step_folder(run_dir, from_step)
    if not step_folders(run_dir):
        raise input_error(
            f"run {run_id}", f"no checkpoint under {run_dir / 'checkpoints'}: it stopped before "
            "its first one", f"start it again as a new attempt: `tunepilot run "
            f"{ws.campaign_file} --retry {run_id}`", title="nothing to resume",
        )  # fmt: skip
    return run_dir


def pinned_step(run_id: str, run_dir: Path, expect: str, from_step: int | None) -> int:
    """The step whose checkpoint MANIFEST.json has sha256 `expect` (`resume --expect`).

    A checkpoint's MANIFEST proves its files were not damaged since it was written, not who
    wrote it: weights edited together with a rewritten MANIFEST verify. A pinned digest,
    recorded when the checkpoint was written, closes that gap the way `verify --expect` does
    for a bundle: resume starts from that checkpoint or refuses, and never falls back."""
    from tunepilot.errors import input_error
    from tunepilot.train.checkpoint import step_folders
    from tunepilot.train.manifest import manifest_digest, parse_pin
    from tunepilot.train.resume_point import parse_step

    want = parse_pin(expect, "paste the sha256 of the checkpoint's MANIFEST.json taken when it "
                     "was written (`sha256sum runs/RUN/checkpoints/step-N/MANIFEST.json`)")
    found = {p: manifest_digest(p) for p in step_folders(run_dir)
             if (p / "MANIFEST.json").is_file()}  # fmt: skip
    match = [p for p, digest in found.items() if digest == want]
    listed = "; ".join(f"{p.name} {d[:12]}" for p, d in found.items()) or "no checkpoint"
    if not match:
        raise input_error(
            "--expect", f"no checkpoint of {run_id} has MANIFEST.json sha256 {want} (found: "
            f"{listed}): the pinned checkpoint was changed, replaced or removed",
            "resume from the checkpoint you pinned (restore it from a backup), or start a new "
            f"attempt with `tunepilot run --retry {run_id}`", title="pinned checkpoint not found",
        )  # fmt: skip
    step = parse_step(match[0].name)
    if from_step is not None and from_step != step:
        raise input_error("--from", f"step {from_step}, but the pinned digest is {match[0].name}",
                          "give one of --from and --expect, or the two for one checkpoint")
    return step


def next_step(ws: Workspace, run_id: str, run_dir: Path) -> str:
    """The command that continues a run: resume from a checkpoint, or retry without one."""
    from tunepilot.train.checkpoint import latest_checkpoint

    if latest_checkpoint(run_dir) is not None:
        return f"continue with `tunepilot resume {run_id} {ws.campaign_file}`"
    return (f"no checkpoint yet: start again with "
            f"`tunepilot run {ws.campaign_file} --retry {run_id}`")  # fmt: skip


def failure_reason(ws: Workspace, run_id: str, run_dir: Path, exc: Exception) -> tuple[str, str]:
    """(status, reason) for a run that ended on an exception. A refusal or a storage fault
    is the campaign's to fix, and the run stays resumable (`interrupted`). A method that does
    not fit the model (a LoRA target matching nothing, a frozen new head) is a failed attempt:
    fixing it changes the configuration, so the fix is a new run, never a resume."""
    from tunepilot.errors import InputError, storage_fault
    from tunepilot.model.build import SetupFailure

    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    if isinstance(exc, SetupFailure):
        return "failed", text[:2000]
    if isinstance(exc, InputError | OSError) or storage_fault(exc) is not None:
        return "interrupted", f"{text[:1800]}; once fixed, {next_step(ws, run_id, run_dir)}"
    return "failed", text[:2000]


def record_end(ledger: Any, run_id: str, status: str, reason: str) -> None:
    """Record how the run ended; a ledger that cannot be written (full disk) must not hide
    the original error, and the next command marks the run interrupted anyway."""
    from tunepilot.errors import InputError

    with contextlib.suppress(InputError):
        ledger.set_status(run_id, status, reason)


def resume_backend(ws: Workspace, run_id: str, run_dir: Path, allow: bool) -> str | None:
    """B1: a run continues on the backend it trained on. Another one (another kernel library,
    another card) changes the numbers mid-curve, so resuming there is refused unless `allow`;
    then the new fingerprint is added to the run's env.json (`resumed_on`), the run counts as
    run on both, and compare sets it apart from runs of one backend. Returns the note."""
    import json

    from tunepilot.errors import input_error
    from tunepilot.measure.env import backend_change, fingerprint, read_env

    before, now = read_env(run_dir), fingerprint()
    change = backend_change(before, now)
    if change is None:
        return None
    if not allow:
        raise input_error(
            f"run {run_id}", f"trained on another backend than this machine's ({change}): the "
            "rest of its curve would not continue the same measurement (B1)",
            f"resume it where it trained, or start it here as a new attempt (`tunepilot run "
            f"{ws.campaign_file} --retry {run_id}`); `--allow-backend-change` resumes anyway "
            "and marks the run as run on both", title="resume on another backend refused",
        )  # fmt: skip
    assert before is not None
    before.setdefault("resumed_on", []).append(now)
    (run_dir / "env.json").write_text(json.dumps(before, indent=2, default=str), encoding="utf-8")
    return (f"{run_id} resumed on another backend ({change}, --allow-backend-change): it ran "
            "on both, and compare sets it apart from runs of one backend (B1)")


def other_backends(ws: Workspace, ledger: Any) -> str | None:
    """B1, for `run`: a sentence when this campaign's completed runs trained on another
    backend than this machine's (compare sets runs of one backend side by side only)."""
    from tunepilot.measure.env import backend_of, fingerprint, read_env

    seen: dict[str, list[str]] = {}
    for row in ledger.list_runs():
        if row.status == "completed":
            found = backend_of(read_env(ledger.run_folder(row)))
            if found is not None:
                seen.setdefault(found, []).append(row.id)
    here = backend_of(fingerprint())
    others = {b: ids for b, ids in seen.items() if b != here}
    if not others or here is None:
        return None
    shown = "; ".join(f"{len(ids)} on {b} (e.g. {ids[0]})" for b, ids in others.items())
    return (f"this machine is {here}, but completed runs of this campaign trained elsewhere "
            f"({shown}): compare sets runs of one backend side by side only (B1); run the "
            "control here too before comparing what you run now")
