"""Gates 9, 12 and 13, what goes beyond one step: the tiny-subset overfit (D7), resume in a
new process (R1) and export (R2).

Overfit: a handful of examples learned at a raised lr; finite values, a falling loss and
their labels or answers recovered. A check of the mechanics, never of generalisation.

Resume: the parent trains RESUME_UPDATES updates through the real loop (`train.loop.train`)
with a checkpoint half-way; then `python -m tunepilot.pilot.child SPEC` - a fresh Python
process that knows only the files - rebuilds the model from the campaign, resumes from that
checkpoint and trains to the end. Compared with the uninterrupted parent: the restored step,
each continued update's learning rate and loss, the ids of the next batch, and the final
weights. On CPU these must be exactly equal (the loop is deterministic there); on a GPU the
losses must agree within RESUME_GPU_RTOL, since some kernels are not bitwise reproducible.
Both sides of the resume live in this one module so they cannot drift apart.

Export: the resume run's trained model is exported with `tunepilot.deliver.export` and reloaded in a
new process, replaying control inputs for identical outputs.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tunepilot.pilot.phases import Outcome, PilotState, worst_verdict
from tunepilot.pilot.update import make_optimizer, train_update
from tunepilot.verdict import Verdict

RESUME_UPDATES = 4  # the parent's run; the child resumes from update RESUME_UPDATES // 2
RESUME_GPU_RTOL = 1e-4
CHILD_TIMEOUT_S = 600
CONTROL_EXAMPLES = 4  # validation inputs replayed after the export reload
_COMPARED = ("update", "lr", "loss", "examples_seen", "epoch", "grad_norm")

OVERFIT_EXAMPLES = 8
OVERFIT_MAX_UPDATES = 100
OVERFIT_LR_FACTOR = 10.0
OVERFIT_LOSS_FACTOR = 4.0
OVERFIT_TOKEN_SHARE = 0.9
"""D7 sizes, stated in the row: 8 examples, at most 100 updates (stopping once both goals are
met) at 10x the campaign's lr; PASS when every loss is finite, the loss falls at least 4x and
every label (classification) or 90% of the answer tokens, teacher-forced, are recovered."""


def _subset(state: PilotState) -> list[Any]:
    """The shortest training examples, one class after another for classification: the
    mechanics do not need long inputs, and short ones keep the gate cheap."""
    data = sorted(state.encoded.train, key=lambda e: (len(e.input_ids), e.example_id))
    if state.kind != "classification":
        return data[:OVERFIT_EXAMPLES]
    by_class: dict[int, list[Any]] = {}
    for e in data:
        by_class.setdefault(e.labels[0], []).append(e)
    queues = [by_class[k] for k in sorted(by_class)]
    picked: list[Any] = []
    while len(picked) < min(OVERFIT_EXAMPLES, len(data)):
        for q in queues:
            if q and len(picked) < OVERFIT_EXAMPLES:
                picked.append(q.pop(0))
    return picked


def _recovered(state: PilotState, update: list[list[Any]]) -> tuple[int, int]:
    """(recovered, total): labels by argmax, or answer tokens by teacher-forced argmax."""
    import torch

    from tunepilot.tasks.base import IGNORE_INDEX
    from tunepilot.train.batching import collate

    hit = total = 0
    state.model.eval()
    try:
        with torch.no_grad():
            for mb in update:
                cpu = collate(mb, state.kind, state.pad_id)
                b = {k: v.to(state.device) for k, v in cpu.items()}
                logits = state.model(**{k: v for k, v in b.items() if k != "labels"}).logits
                if state.kind == "classification":
                    hit += int((logits.argmax(-1) == b["labels"]).sum())
                    total += len(mb)
                else:
                    pred, gold = logits[:, :-1].argmax(-1), b["labels"][:, 1:]
                    mask = gold != IGNORE_INDEX
                    hit += int(((pred == gold) & mask).sum())
                    total += int(mask.sum())
    finally:
        state.model.train()
    return hit, total


def overfit_gate(state: PilotState) -> Outcome:
    """Gate 9 (D7): a handful of examples learned to check the mechanics. The trainable
    weights are restored afterwards, so later gates see the model as the steps left it."""
    import torch

    t = state.training
    subset = _subset(state)
    # Microbatches never hold more tokens than the configured one at the longest length, which
    # the first step proved: the subset's short examples usually fit in one.
    proven = t.microbatch * max(1, *(len(e.input_ids) for e in state.encoded.train))
    mb = max(1, min(len(subset), proven // max(1, *(len(e.input_ids) for e in subset))))
    update = [subset[i : i + mb] for i in range(0, len(subset), mb)]
    lr = t.lr * OVERFIT_LR_FACTOR
    params = [p for p in state.model.parameters() if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    optimizer = make_optimizer(state.model, t, lr)
    losses: list[float] = []
    hit, total = 0, 0
    unit = "labels" if state.kind == "classification" else "answer tokens"
    where = (
        f"the {len(subset)} shortest training examples, lr {lr:.3g} "
        f"({OVERFIT_LR_FACTOR:.0f}x the campaign's)"
    )
    try:
        for n in range(1, OVERFIT_MAX_UPDATES + 1):
            loss, norm = train_update(state, update, optimizer, lr)
            losses.append(loss)
            if not (math.isfinite(loss) and math.isfinite(norm)):
                return Outcome(Verdict.FAIL, f"{where}: update {n} gave loss {loss} (gradient norm "
                               f"{norm}); lower training.lr (tried {lr:.3g} here, the campaign "
                               f"uses {t.lr:.3g}) and check the data; a long rental will not fix "
                               "it (D7)", {"losses": losses}, dict(state.shape))  # fmt: skip
            fell = loss <= losses[0] / OVERFIT_LOSS_FACTOR
            if fell and (n % 5 == 0 or n == OVERFIT_MAX_UPDATES):
                hit, total = _recovered(state, update)
                if hit >= _needed(state, total):
                    break
        if not hit:
            hit, total = _recovered(state, update)
    finally:
        with torch.no_grad():
            for p, old in zip(params, saved, strict=True):
                p.copy_(old)
                p.grad = None
    factor = losses[0] / losses[-1] if losses[-1] > 0 else math.inf
    details = {"losses": losses, "recovered": hit, "total": total, "lr": lr, "updates": len(losses),
               "example_ids": [e.example_id for e in subset]}  # fmt: skip
    seen = (f"{where}, {len(losses)} updates: loss {losses[0]:.3f} -> {losses[-1]:.3g} "
            f"(fell {factor:.1f}x, goal >= {OVERFIT_LOSS_FACTOR:.0f}x), {hit}/{total} {unit} "
            "recovered")  # fmt: skip
    note = "a check of the mechanics, not a claim about generalisation (D7)"
    recovered = hit >= _needed(state, total)
    if factor >= OVERFIT_LOSS_FACTOR and recovered:
        return Outcome(Verdict.PASS, f"{seen}; {note}", details, dict(state.shape))
    if recovered and factor > 1:  # it learns them, but cannot make the output confident
        return Outcome(Verdict.WARN, f"{seen}: recovered, yet the loss barely falls: the trained "
                       "part ranks the answers but cannot sharpen the output (is the output layer "
                       f"frozen? see model.lora.modules_to_save); {note}", details,
                       dict(state.shape))  # fmt: skip
    return Outcome(Verdict.FAIL, f"{seen}: the model cannot learn even these; check the labels, "
                   "the loss mask, and that the trained parameters reach the output and are "
                   "enough (LoRA rank, target modules): a long rental will not fix it; "
                   f"{note}", details, dict(state.shape))  # fmt: skip


def _needed(state: PilotState, total: int) -> int:
    if state.kind == "classification":
        return total
    return int(total * OVERFIT_TOKEN_SHARE + 0.999999)


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

    settings = _resume_settings(state.training)
    half, root = RESUME_UPDATES // 2, state.folder / "resume"
    data = state.encoded.train
    model = state.session.build_model(state.campaign, state.seed).to(state.device)
    state.shape = {"microbatch": settings.microbatch, "accumulation": settings.accumulation}
    # Both sides on the same thread count (CPU kernels may sum in another order otherwise);
    # one thread keeps the child from stalling when other work shares the cores.
    before = torch.get_num_threads()
    threads = 1 if state.device.type == "cpu" else before
    torch.set_num_threads(threads)
    try:
        result = train(model, data, settings, root / "parent", kind=state.kind,
                       pad_id=state.pad_id, progress=False)  # fmt: skip
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
    model = session.build_model(campaign, int(spec["seed"])).to(spec["device"])
    kind = "classification" if campaign.hypothesis.is_classification else "causal_lm"
    pad = pad_id_of(ws.tokenizer)
    result = train(model, encoded.train, settings, run_dir, kind=kind, pad_id=pad, resume=folder,
                   progress=False)  # fmt: skip
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
