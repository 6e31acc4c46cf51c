"""Gates 12 and 13, what needs a second process: resume in a new process (R1) and export (R2).

Resume: the parent trains RESUME_UPDATES updates through the real loop (`train.loop.train`)
with a checkpoint half-way; then `python -m tunepilot.pilot.child SPEC` - a fresh Python
process that knows only the files - rebuilds the model from the campaign, resumes from that
checkpoint and trains to the end. Compared with the uninterrupted parent: the restored step,
each continued update's learning rate and loss, the ids of the next batch, and the final
weights. On CPU these must be exactly equal (the loop is deterministic there); on a GPU the
losses must agree within RESUME_GPU_RTOL, since some kernels are not bitwise reproducible.
Both sides of the resume live in this one module so they cannot drift apart.

Export: the resume run's trained model is exported with `tunepilot.deliver.export` and
reloaded in a new process, replaying control inputs for identical outputs.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tunepilot.pilot.phases import Outcome, PilotState, worst_verdict
from tunepilot.verdict import Verdict

RESUME_UPDATES = 4  # the parent's run; the child resumes from update RESUME_UPDATES // 2
RESUME_GPU_RTOL = 1e-4
CHILD_TIMEOUT_S = 600
CONTROL_EXAMPLES = 4  # validation inputs replayed after the export reload
_COMPARED = ("update", "lr", "loss", "examples_seen", "epoch", "grad_norm")

def _resume_settings(training: Any) -> Any:
    """The campaign's training settings with a short budget and a checkpoint half-way."""
    from tunepilot.campaign import Budget, StopCauses, TrainingSettings

    dumped = training.model_dump(mode="json")
    dumped.update(budget=Budget(updates=RESUME_UPDATES).model_dump(), eval_every=10**6,
                  checkpoint_every=RESUME_UPDATES // 2, keep_last_checkpoints=2,
                  stop=StopCauses().model_dump())  # fmt: skip
    return TrainingSettings.model_validate(dumped)


def _next_batch_ids(data: list[Any], settings: Any, sampler_state: dict[str, Any] | None,
                    skip: int) -> list[list[str]]:  # fmt: skip
    """Example ids of the next update: after `skip` updates of a fresh sampler, or after a
    sampler restored from a checkpoint's `sampler_state`."""
    from tunepilot.train.batching import UpdateSampler

    sampler = UpdateSampler([len(e.input_ids) for e in data], settings.microbatch,
                            settings.accumulation, seed=settings.seed, drop_last=settings.drop_last,
                            bucket_by_length=settings.bucket_by_length)  # fmt: skip
    if sampler_state is not None:
        sampler.load_state_dict(sampler_state)
    for _ in range(skip):
        sampler.next_update()
    return [[data[i].example_id for i in mb] for mb in sampler.next_update().microbatches]


def _metrics(run_dir: Path) -> dict[int, dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return {int(r["update"]): r for r in lines}


def _weights_sha(run_dir: Path) -> str | None:
    from tunepilot.train.checkpoint import latest_checkpoint

    folder = latest_checkpoint(run_dir)
    if folder is None:
        return None
    files = sorted(folder.glob("*model*.safetensors"))
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest() if files else None


def _same(x: Any, y: Any, exact: bool) -> bool:
    """Equal on CPU; on a GPU floats agree within RESUME_GPU_RTOL."""
    if exact or not isinstance(x, float) or not isinstance(y, float):
        return bool(x == y)
    return abs(x - y) <= RESUME_GPU_RTOL * max(abs(x), 1e-12)


def resume_gate(state: PilotState) -> Outcome:
    """Gate 12 (R1): the uninterrupted run and the one resumed in a new process agree."""
    import torch

    from tunepilot.train.checkpoint import step_folder
    from tunepilot.train.loop import train
    from tunepilot.train.packing import packing_of

    settings = _resume_settings(state.training)
    half, root = RESUME_UPDATES // 2, state.folder / "resume"
    data = state.encoded.train
    model = state.session.build_model(state.campaign, state.seed, str(state.device))
    state.shape = {"microbatch": settings.microbatch, "accumulation": settings.accumulation}
    # Both sides on the same thread count (CPU kernels may sum in another order otherwise);
    # one thread keeps the child from stalling when other work shares the cores.
    before = torch.get_num_threads()
    threads = 1 if state.device.type == "cpu" else before
    torch.set_num_threads(threads)
    try:
        result = train(model, data, settings, root / "parent", kind=state.kind,
                       pad_id=state.pad_id, progress=False,
                       packing=packing_of(state.campaign))  # fmt: skip
    finally:
        torch.set_num_threads(before)
    state.trained_model = model
    parent = _metrics(root / "parent")
    spec = {
        "campaign_file": str(state.ws.campaign_file), "overrides": state.ws.overrides,
        "seed": state.seed, "settings": settings.model_dump(mode="json"),
        "resume": str(step_folder(root / "parent", half)), "run_dir": str(root / "child"),
        "threads": threads, "device": str(state.device),
        "out": str(root / "child.json"),
    }  # fmt: skip
    (root / "spec.json").write_text(json.dumps(spec, indent=2), encoding="utf-8")
    tick = time.perf_counter()
    command = [sys.executable, "-m", "tunepilot.pilot.child", str(root / "spec.json")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                          check=False)  # fmt: skip
    seconds = time.perf_counter() - tick
    state.measurements["resume_seconds"] = seconds
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])[:400]
        return Outcome(Verdict.FAIL, f"the resumed process exited {done.returncode}: {tail}; "
                       f"run `{' '.join(command)}` to see it all",
                       {"stderr": done.stderr[-6000:]})  # fmt: skip
    child = json.loads((root / "child.json").read_text(encoding="utf-8"))
    exact = state.device.type == "cpu"
    problems = []
    if child["restored_update"] != half:
        problems.append(f"restored step {child['restored_update']}, expected {half}")
    if child["updates"] != result.updates:
        problems.append(f"child ended at update {child['updates']}, parent at {result.updates}")
    expected_ids = _next_batch_ids(data, settings, None, half)
    if child["next_batch_ids"] != expected_ids:
        problems.append(f"next batch ids {child['next_batch_ids']} != {expected_ids}")
    theirs = {int(k): v for k, v in child["metrics"].items()}
    for update in range(half + 1, RESUME_UPDATES + 1):
        a, b = parent.get(update, {}), theirs.get(update, {})
        for key in _COMPARED:
            x, y = a.get(key), b.get(key)
            if not _same(x, y, exact):
                problems.append(f"update {update} {key}: {x} uninterrupted, {y} resumed")
    if exact and child["weights_sha256"] != _weights_sha(root / "parent"):
        problems.append("final weights differ from the uninterrupted run's")
    details = {"parent": {str(k): parent[k] for k in sorted(parent)}, "child": child,
               "seconds": seconds, "exact": exact}  # fmt: skip
    what = (f"{RESUME_UPDATES} updates uninterrupted vs resumed at update {half} in a new process "
            f"({seconds:.3g} s)")  # fmt: skip
    if problems:
        return Outcome(Verdict.FAIL, f"{what}: {'; '.join(problems[:4])}; resume is not exact: "
                       "do not rely on it for a long rental (R1)", details)  # fmt: skip
    rule = "bitwise equal" if exact else f"equal within {RESUME_GPU_RTOL:g} (GPU)"
    last = parent[RESUME_UPDATES]["loss"]
    return Outcome(Verdict.PASS, f"{what}: step {half} restored; lr, loss (last {last:.6g}), "
                   f"next batch ids and final weights {rule} to the uninterrupted run (R1)",
                   details)  # fmt: skip


def _export_functions() -> tuple[Any, Any] | str:
    """(export_model, verify) from tunepilot.deliver.export and .verify, or why not."""
    try:
        from tunepilot.deliver.export import export_model
    except ImportError as exc:
        return str(exc)
    try:
        from tunepilot.deliver.verify import verify_bundle as verify
    except ImportError:
        try:
            from tunepilot.deliver.export import verify_bundle_in_new_process as verify
        except ImportError as exc:
            return str(exc)
    return export_model, verify


def export_gate(state: PilotState) -> Outcome:
    """Gate 13 (R2, P4): export, reload in a new process, control inputs replayed."""
    found = _export_functions()
    if isinstance(found, str):
        return Outcome(Verdict.FAIL, f"export module not available ({found}); the export and "
                       "reload cannot be checked until tunepilot.deliver exists")  # fmt: skip
    export_model, verify = found
    model = state.trained_model if state.trained_model is not None else state.model
    control = _controls(state.prepared.splits["validation"])
    tick = time.perf_counter()
    bundle = export_model(model, state.ws.tokenizer, state.campaign, state.ws.model_source,
                          state.folder / "export", data_version=state.prepared.version,
                          metrics=state.eval_metrics, control_examples=control,
                          encoder=state.encoded.encoder, run_id=state.pilot_id)  # fmt: skip
    exported = time.perf_counter() - tick
    findings = verify(bundle)
    seconds = time.perf_counter() - tick
    state.measurements["export_seconds"] = seconds
    verdict = worst_verdict([f.verdict for f in findings]) if findings else Verdict.FAIL
    details = {"bundle": str(Path(bundle).relative_to(state.ws.root)), "export_seconds": exported,
               "findings": [f.to_json() for f in findings]}  # fmt: skip
    if not findings:
        return Outcome(verdict, "the reload check returned no finding: nothing verified", details)
    head = (f"exported in {exported:.3g} s, reloaded in a new process, {len(control)} control "
            f"inputs replayed ({seconds:.3g} s in all)")  # fmt: skip
    if verdict is Verdict.PASS:
        return Outcome(verdict, f"{head}: {len(findings)} checks passed (R2, P4)", details)
    said = "; ".join(f"{f.check}: {f.sentence}" for f in findings if f.verdict is verdict)
    return Outcome(verdict, f"{head}: {said}", details)


def _controls(examples: list[Any]) -> list[Any]:
    """The same control inputs `tunepilot export` picks, when that chooser exists."""
    try:
        from tunepilot.deliver.controls import choose_controls
    except ImportError:
        return examples[:CONTROL_EXAMPLES]
    return choose_controls(examples, CONTROL_EXAMPLES)


# ---------------------------------------------------------------------------------------------
# the child process
# ---------------------------------------------------------------------------------------------


def _peak_rss_bytes() -> int | None:
    """This process's peak RSS (VmHWM), reported back so the row can show the child's memory."""
    from tunepilot.measure.counters import PROC_STATUS, proc_status_bytes

    return proc_status_bytes().get("VmHWM") if PROC_STATUS.is_file() else None


def child_main(spec_path: str) -> int:
    """Resume the parent's run from its half-way checkpoint, knowing only the files."""
    import torch

    from tunepilot.campaign import TrainingSettings
    from tunepilot.campaign.variants import CONTROL
    from tunepilot.data.workspace import Workspace
    from tunepilot.experiments.evaluate import pad_id_of
    from tunepilot.experiments.runner import Session, run_campaign_for
    from tunepilot.train.loop import train
    from tunepilot.train.packing import packing_of

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    torch.set_num_threads(int(spec["threads"]))
    ws = Workspace.open(spec["campaign_file"], spec["overrides"])
    session = Session(ws)
    campaign = run_campaign_for(ws, CONTROL, int(spec["seed"]))
    encoded = session.encoded(campaign)
    settings = TrainingSettings.model_validate(spec["settings"])
    folder, run_dir = Path(spec["resume"]), Path(spec["run_dir"])
    saved = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    next_ids = _next_batch_ids(encoded.train, settings, saved["sampler"], 0)
    model = session.build_model(campaign, int(spec["seed"]), str(spec["device"]))
    kind = "classification" if campaign.hypothesis.is_classification else "causal_lm"
    pad = pad_id_of(ws.tokenizer)
    result = train(model, encoded.train, settings, run_dir, kind=kind, pad_id=pad, resume=folder,
                   progress=False, packing=packing_of(campaign))  # fmt: skip
    out = {
        "restored_update": int(saved["update"]), "next_batch_ids": next_ids,
        "status": result.status, "updates": result.updates,
        "metrics": {str(k): v for k, v in _metrics(run_dir).items()},
        "weights_sha256": _weights_sha(run_dir), "peak_rss_bytes": _peak_rss_bytes(),
    }  # fmt: skip
    Path(spec["out"]).write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python -m tunepilot.pilot.child SPEC.json\n")
        raise SystemExit(2)
    raise SystemExit(child_main(sys.argv[1]))
