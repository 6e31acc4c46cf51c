"""Gates 2-8, 10 and 11 of the pilot: data, inspect, load, update audit, first step, steady
step, accumulation, evaluation at the longest sequences, checkpoint save (D3, D4, D9, P3, R1,
S1, S2, S4).

Each gate is a plain function of the shared `PilotState` that returns an `Outcome`; the runner
in phases.py measures it with the one memory probe and turns it into a row. The step gates run
`update.train_update`, built from the loop's own pieces, so what the pilot proves is what
training runs, never a re-implementation.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from tunepilot.pilot.phases import Outcome, PilotState, synchronize, worst_verdict
from tunepilot.pilot.update import (
    longest_microbatches,
    machine_load,
    make_optimizer,
    timing_flag,
    train_update,
)
from tunepilot.verdict import Verdict

STEADY_STEPS = 3
"""Updates timed after the first: the first allocates optimizer state and warms caches, so its
time and peak are reported separately and left out of the steady median (S4)."""
DIVERGING = 2.0
"""The steady updates repeat the first update's examples: a loss that more than doubles on the
same examples within a few updates means the learning rate overshoots."""
ACCUMULATION_RTOL = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2, "bf16 weights": 5e-2}
"""Largest gradient difference allowed between microbatch x accumulation and one batch of the
same examples, relative to the largest gradient: float summation order (and padding width)
differ between the two; half-precision autocast rounds far more, and bf16 trained weights most
(every matmul of the forward in bf16, and the gradient summed in bf16 over the microbatches:
the tiny Llama measured 1.7e-2 and 2.3e-2). A normalisation error (a mean per microbatch)
shows as the relative spread of the microbatches' target counts, which the looser bounds
catch only when that spread exceeds them."""


# ---------------------------------------------------------------------------------------------
# gates 2-5: data, inspect, load, update audit
# ---------------------------------------------------------------------------------------------


def data_gate(state: PilotState) -> Outcome:
    """Gate 2: the audit's verdicts (leakage, duplicates, truncation, label mapping, D2-D8)."""
    from tunepilot.data.flow import audit_findings
    from tunepilot.experiments.runner import Session

    prepared, findings = audit_findings(state.ws)
    state.prepared, state.audit = prepared, findings
    state.session = Session(state.ws)
    state.encoded = state.session.encoded(state.campaign)
    counts = {k: len(v) for k, v in prepared.splits.items()}
    details = {"version": prepared.version, "counts": counts,
               "findings": [f.to_json() for f in findings]}  # fmt: skip
    verdict = worst_verdict([f.verdict for f in findings])
    sizes = ", ".join(f"{k} {n}" for k, n in counts.items())
    head = f"data version {prepared.version} ({sizes}), {len(findings)} audit checks"
    if verdict is Verdict.PASS:
        return Outcome(verdict, f"{head}, all PASS", details)
    named = [f for f in findings if f.verdict is verdict]
    said = "; ".join(f"{f.check}: {f.sentence}" for f in named)
    word = "failed" if verdict is Verdict.FAIL else "warned"
    return Outcome(verdict, f"{head}; {len(named)} {word}: {said}", details)


def inspect_gate(state: PilotState) -> Outcome:
    """Gate 3: rendered samples saved with the pilot for a person to read (D3, D4)."""
    import json
    from dataclasses import asdict

    from rich.console import Console

    from tunepilot.data.inspect import print_samples, render_samples

    per_class = 1 if state.kind == "classification" else 0
    train = state.prepared.splits["train"]
    if state.campaign.hypothesis.task == "image_classification":
        from tunepilot.data.images.show import samples_json, show_images
        found, sheet = show_images(state.encoded.encoder, train, "train", state.ws.root,
                                   state.folder, 0, 1)  # fmt: skip
        text = json.dumps(samples_json(found), indent=2, ensure_ascii=False)
        (state.folder / "samples.json").write_text(text, encoding="utf-8")
        where = f"pilots/{state.pilot_id}/{sheet.name if sheet else 'samples.json'}"
        return Outcome(Verdict.PASS, f"{len(found)} images (one per class), every transform "
                       f"with its shape and value range, drawn to {where}: look at it first")
    samples = render_samples(state.encoded.encoder, state.ws.tokenizer, train, 3, per_class)
    text = json.dumps([asdict(s) for s in samples], indent=2, ensure_ascii=False)
    (state.folder / "samples.json").write_text(text, encoding="utf-8")
    with (state.folder / "samples.txt").open("w", encoding="utf-8") as handle:
        print_samples(samples, Console(file=handle, width=110, color_system=None))
    notes = [f"{s.id}: {n}" for s in samples for n in s.notes]
    where = f"pilots/{state.pilot_id}/samples.txt"
    what = f"{len(samples)} samples" + (" (one per class)" if per_class else "")
    if notes:
        said = "; ".join(notes[:3])
        return Outcome(Verdict.WARN, f"{what} rendered to {where}; {said}: read them first",
                       {"notes": notes})  # fmt: skip
    sentence = (
        f"{what} rendered with tokens, separators and loss positions to {where}: read them "
        "before renting (the pilot cannot judge them for you)"
    )
    return Outcome(Verdict.PASS, sentence)


def load_gate(state: PilotState) -> Outcome:
    """Gate 4: base + head + method with the set-up checks (P1, P2); memory and time."""
    from tunepilot.model.build import enable_activation_checkpointing
    from tunepilot.model.params import trainable_report

    model = state.session.build_model(state.campaign, state.seed, str(state.device))  # or FAIL
    notes: list[str] = []
    if state.training.activation_checkpointing:
        notes = enable_activation_checkpointing(model)
    state.model = model
    report = state.report = trainable_report(state.model)
    share = report.trainable_params / max(report.total_params, 1)
    lora = f" r={report.lora_rank} on {report.target_modules}" if report.method == "lora" else ""
    saved = f", saved whole: {sorted(report.extra_saved)}" if report.extra_saved else ""
    sentence = (
        f"{type(model).__name__} on {state.device}: {report.trainable_params:,} of "
        f"{report.total_params:,} parameters trainable ({share:.2%}, {report.method}{lora}"
        f"{saved}); loading alone does not prove a step fits (S1)"
    )
    details = {"trainable": report.to_json() | {"rows": None}, "notes": notes}
    return Outcome(Verdict.PASS, sentence, details)


def update_audit_gate(state: PilotState) -> Outcome:
    """Gate 5: two real updates on a real batch change exactly the trainable tensors (P3)."""
    from tunepilot.model.params import update_audit
    from tunepilot.train.batching import UpdateSampler, collate, count_targets, microbatch_loss

    t, data, kind = state.training, state.encoded.train, state.kind
    sampler = UpdateSampler([len(e.input_ids) for e in data], t.microbatch, 1, seed=t.seed)
    ids = sampler.next_update().microbatches[0]
    cpu_batch = collate([data[i] for i in ids], kind, state.pad_id, state.packing)
    batch = {k: v.to(state.device) for k, v in cpu_batch.items()}
    length = int(batch["input_ids"].shape[1]) if "input_ids" in batch else 0  # 0: pixels
    state.shape = {"microbatch": len(ids), "length": length, "accumulation": 1}

    def batch_loss(model: Any) -> Any:
        loss = microbatch_loss(model, batch, kind, chunks=t.loss_chunks)  # as the loop's
        return loss / count_targets(batch, kind)

    # The audit reads every gradient after backward: with the step in backward they are freed
    # in the hooks, so it steps the same optimizer after backward (which parameters move is
    # the same either way); the gates below time and size the configured step.
    audited = t.model_copy(update={"optimizer_in_backward": False})
    findings = update_audit(state.model, batch_loss, lambda m: make_optimizer(m, audited),
                            updates=2)  # fmt: skip
    which = ", ".join(data[i].example_id for i in ids[:3])
    sentence = f"on training examples {which}: " + "; ".join(f.sentence for f in findings)
    details = {"findings": [f.to_json() for f in findings]}
    return Outcome(worst_verdict([f.verdict for f in findings]), sentence, details,
                   inputs=dict(state.shape))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# gates 6-8: first step, steady step, accumulation (S1, S2, S4)
# ---------------------------------------------------------------------------------------------


def first_step_gate(state: PilotState) -> Outcome:
    """Gate 6: one complete update (loss, backward, optimizer step) at the configured
    microbatch and accumulation on the longest training examples: the step that allocates
    the optimizer state, so it can exceed memory where loading fit (S1, S4)."""
    t = state.training
    update = longest_microbatches(state.encoded.train, t.microbatch, t.accumulation)
    state.optimizer = make_optimizer(state.model, t)
    loss, norm = train_update(state, update, state.optimizer, t.lr)
    inputs, details = dict(state.shape), {"loss": loss, "grad_norm": norm}
    if not (math.isfinite(loss) and math.isfinite(norm)):
        return Outcome(Verdict.FAIL, f"the first update's loss is {loss} (gradient norm {norm}) "
                       f"at lr {t.lr}: the update was not applied; lower training.lr or check "
                       "the data for empty targets", details, inputs)  # fmt: skip
    state.updates_done += 1
    state.measurements["first_loss"] = loss
    ids = [e.example_id for e in update[0]]
    details["example_ids"] = ids
    return Outcome(Verdict.PASS, f"loss {loss:.4f}, gradient norm {norm:.3g}; optimizer state "
                   f"allocated; the {t.microbatch * t.accumulation} longest training examples "
                   f"(e.g. {', '.join(ids[:2])}) in {t.accumulation} microbatch(es)",
                   details, inputs)  # fmt: skip


def steady_step_gate(state: PilotState) -> Outcome:
    """Gate 7: the next updates at the same shape; their median time feeds the plan (S4)."""
    t = state.training
    update = longest_microbatches(state.encoded.train, t.microbatch, t.accumulation)
    losses: list[float] = []
    seconds: list[float] = []
    cpu_seconds: list[float] = []
    for _ in range(STEADY_STEPS):
        synchronize(state.device)
        tick, cpu_tick = time.perf_counter(), time.process_time()
        loss, _ = train_update(state, update, state.optimizer, t.lr)
        seconds.append(time.perf_counter() - tick)
        cpu_seconds.append(time.process_time() - cpu_tick)
        losses.append(loss)
        if not math.isfinite(loss):
            return Outcome(Verdict.FAIL, f"update {state.updates_done + 1} gave loss {loss} at lr "
                           f"{t.lr}; the update was not applied: lower training.lr",
                           {"losses": losses}, dict(state.shape))  # fmt: skip
        state.updates_done += 1
    median = statistics.median(seconds)
    load = machine_load(state.device, statistics.median(cpu_seconds))
    state.measurements.update(step_seconds=median, step_shape=dict(state.shape), **load)
    noisy = timing_flag(state.measurements)
    details = {"losses": losses, "seconds": seconds, "median_seconds": median,
               "cpu_seconds": cpu_seconds, "timing_noisy": bool(noisy)}  # fmt: skip
    first = state.measurements.get("first_loss")
    if first is not None and max(losses) > DIVERGING * first:
        return Outcome(Verdict.FAIL, f"the loss rose from {first:.4g} to {max(losses):.4g} within "
                       f"{STEADY_STEPS + 1} updates on the same examples at lr {t.lr:.3g}: the "
                       "learning rate overshoots; lower training.lr (the run would diverge)",
                       details, dict(state.shape))  # fmt: skip
    said = ", ".join(f"{x:.4f}" for x in losses)
    image = image_size(state.encoded.train)
    at = f"of {image} pixels" if image else "at the longest length (an upper bound for the plan)"
    return Outcome(Verdict.PASS, f"{STEADY_STEPS} more updates at the same shape: median "
                   f"{median:.3g} s per update of {t.microbatch * t.accumulation} examples {at}, "
                   f"losses {said}{noisy}",
                   details, dict(state.shape))  # fmt: skip


def image_size(encoded: list[Any]) -> str | None:
    """The pictures' size ("3x224x224", the processor's, the same for all), None for token
    sequences: gate sentences then speak of pixels, not lengths."""
    first = next(iter(encoded), None)
    pixels = getattr(first, "pixel_values", None)
    return "x".join(str(int(n)) for n in pixels.shape) if pixels is not None else None


def accumulation_gate(state: PilotState) -> Outcome:
    """Gate 8: microbatch x accumulation gives the gradient of one batch of the same examples
    (S2), through the loop's normalisation by the whole update's target count.

    Dropout is off for both passes (eval mode; gradients still flow): with it on, the two
    passes draw different masks and the comparison would measure the noise. An accumulation
    of 1 is compared as 2 microbatches, so the check still exercises the sum.
    """
    t = state.training
    mb = t.microbatch if t.accumulation > 1 else max(1, t.microbatch // 2)
    acc = t.accumulation if t.accumulation > 1 else 2
    split = longest_microbatches(state.encoded.train, mb, acc)
    params = [(n, p) for n, p in state.model.named_parameters() if p.requires_grad]
    was_training = state.model.training
    state.model.eval()
    try:
        train_update(state, split, state.optimizer, 0.0, step=False, keep_grads=True)
        accumulated = {n: p.grad.detach().clone() for n, p in params if p.grad is not None}
        for _, p in params:
            p.grad = None
        whole = [[e for part in split for e in part]]
        train_update(state, whole, state.optimizer, 0.0, step=False, keep_grads=True)
        single = {n: p.grad.detach().clone() for n, p in params if p.grad is not None}
    finally:
        for _, p in params:
            p.grad = None
        state.model.train(was_training)
    missing = sorted(set(single) ^ set(accumulated))
    scale = max((float(g.abs().max()) for g in single.values()), default=0.0)
    common = [n for n in single if n in accumulated]
    diff = max((float((accumulated[n] - single[n]).abs().max()) for n in common), default=0.0)
    rounding = "bf16 weights" if t.weights_dtype == "bf16" else t.precision
    rtol = ACCUMULATION_RTOL[rounding]
    relative = diff / scale if scale > 0 else math.inf
    lengths = sorted({len(e.input_ids) for part in split for e in part})
    inputs = {"microbatch": mb, "accumulation": acc, "length": lengths[-1]}
    details = {"max_abs_diff": diff, "max_abs_grad": scale, "relative": relative, "rtol": rtol,
               "tensors": len(single), "lengths": lengths, "missing": missing}  # fmt: skip
    same = f"{acc} microbatches of {mb} and one batch of {mb * acc}"
    if missing:
        return Outcome(Verdict.FAIL, f"{same}: tensors get a gradient in one pass only "
                       f"({missing[:3]}): the loss does not reach the same parameters (S2)",
                       details, inputs)  # fmt: skip
    if not relative <= rtol:
        return Outcome(Verdict.FAIL, f"{same} give gradients that differ by {relative:.2e} of the "
                       f"largest (tolerance {rtol:.0e}): the loss normalisation is inconsistent "
                       "(S2)", details, inputs)  # fmt: skip
    image = image_size(split[0])
    sizes = f"images of {image}" if image else f"lengths {lengths[0]}-{lengths[-1]}"
    return Outcome(Verdict.PASS, f"{acc} microbatches of {mb} equal one batch of {mb * acc} on the "
                   f"same examples ({sizes}): largest gradient "
                   f"difference {relative:.1e} of the largest gradient, tolerance {rtol:.0e} in "
                   f"{rounding}; loss normalised by the update's target count (S2)",
                   details, inputs)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# gates 10-11: evaluation at the longest sequences, checkpoint save
# ---------------------------------------------------------------------------------------------


def evaluation_gate(state: PilotState) -> Outcome:
    """Gate 10: the evaluation procedure on one batch of the longest validation examples,
    generation included for generation tasks: it can be the highest peak (S4)."""
    t = state.training
    examples, encoded = state.prepared.splits["validation"], state.encoded.validation
    order = sorted(range(len(examples)), key=lambda i: len(encoded[i].input_ids), reverse=True)
    chosen = [examples[i] for i in order[: t.eval_batch_size]]
    length = len(encoded[order[0]].input_ids)
    state.shape = {"microbatch": len(chosen), "length": length, "accumulation": 1}
    if state.hooks.before_forward is not None:
        state.hooks.before_forward(state.phase)
    result = state.session.evaluate(state.model, state.campaign, examples=chosen)
    synchronize(state.device)
    seconds = result.timings["seconds"]
    full = seconds / len(chosen) * len(examples)
    state.measurements["eval_seconds"] = full
    state.eval_metrics = result.metrics
    gen = f" with greedy generation of up to {t.max_new_tokens} new tokens"
    image = image_size(encoded)
    which = (f"{len(chosen)} validation images ({image}, the processor's one size)" if image
             else f"{len(chosen)} longest validation examples (up to {length} tokens)")  # fmt: skip
    sentence = (
        f"the {which} in one batch of "
        f"{t.eval_batch_size}{gen if state.kind != 'classification' else ''}: {seconds:.3g} s; "
        f"a full validation pass of {len(examples)} examples is estimated at {full:.3g} s (an "
        "upper bound)"
    )
    details = {"metrics": result.metrics, "config_hash": result.config_hash, "seconds": seconds}
    loss = result.metrics.get("loss")
    if isinstance(loss, float) and not math.isfinite(loss):
        return Outcome(Verdict.WARN, f"{sentence}; its loss is {loss}: check the loss positions "
                       "of the validation examples", details, dict(state.shape))  # fmt: skip
    return Outcome(Verdict.PASS, f"{sentence}; the metrics mean nothing yet (a few pilot updates)",
                   details, dict(state.shape))  # fmt: skip


def checkpoint_inputs(state: PilotState, replicas: int = 1) -> tuple[dict[str, Any], dict]:
    """(sampler state, extra state) a run would save after the pilot's updates."""
    from tunepilot.train.arithmetic import plan_from_settings
    from tunepilot.train.batching import UpdateSampler
    from tunepilot.train.checkpoint import run_identity

    t, data = state.training, state.encoded.train
    sampler = UpdateSampler([len(e.input_ids) for e in data], t.microbatch, t.accumulation,
                            seed=t.seed, drop_last=t.drop_last,
                            bucket_by_length=t.bucket_by_length)  # fmt: skip
    for _ in range(state.updates_done):
        sampler.next_update()
    plan = plan_from_settings(len(data), t, replicas).to_json()
    scaler = state.scaler.state_dict() if state.scaler is not None else None
    extra = {"seed": t.seed, "examples_seen": 0, "elapsed_seconds": 0.0, "grad_scaler": scaler,
             "plan": plan, **run_identity(t, data)}  # fmt: skip
    return sampler.state_dict(), extra


def checkpoint_gate(state: PilotState) -> Outcome:
    """Gate 11: the full training state saved as a run would save it: time, size, memory (R1)."""
    from tunepilot.train.checkpoint import save_checkpoint

    sampler, extra = checkpoint_inputs(state)
    tick = time.perf_counter()
    folder = save_checkpoint(state.folder / "checkpoint", state.updates_done, state.model,
                             state.optimizer, sampler, extra, keep_last=1)  # fmt: skip
    return checkpoint_outcome(state, folder, tick)


def checkpoint_outcome(state: PilotState, folder: Any, tick: float) -> Outcome:
    """The checkpoint gate's verdict on a step folder saved since `tick`: time, size, and its
    manifest verified."""
    from tunepilot.measure.memory import human_bytes
    from tunepilot.train.checkpoint import verify_checkpoint

    synchronize(state.device)
    seconds = time.perf_counter() - tick
    manifest = verify_checkpoint(folder)
    size = sum(int(f["bytes"]) for f in manifest["files"].values())
    state.measurements["checkpoint_seconds"] = seconds
    state.measurements["checkpoint_bytes"] = size
    return Outcome(Verdict.PASS, f"saved {folder.name} ({len(manifest['files'])} files, "
                   f"{human_bytes(size)}: weights, optimizer state, sampler position, generators) "
                   f"in {seconds:.3g} s and verified its manifest (R1, R4)",
                   {"folder": str(folder.relative_to(state.ws.root)), "bytes": size,
                    "seconds": seconds})  # fmt: skip
