"""`tunepilot verify DIR` and `tunepilot export RUN`: deliver a bundle and prove it reloads (R2-R4).

The check itself lives in `tunepilot.bundle_check`, which this module starts in a *new*
Python process: the parent's memory (a model that trained, a tokenizer already patched, a
module already imported) must not be able to make a broken bundle pass. The child is started
with `-P` so neither the working folder nor the bundle folder can shadow a module it imports,
and with `HF_HUB_OFFLINE=1` unless downloads were allowed, so a missing base fails in seconds
instead of reaching for the network.

The other half of the check is here too: `compute_controls` records what the model *in
memory* answers to a few validation inputs, before export writes anything. Those answers are
what the child must reproduce from the files alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tunepilot.data.example import Example
from tunepilot.errors import input_error
from tunepilot.verdict import Finding, Verdict
from tunepilot.workspace import Workspace

CHECK_MODULE = "tunepilot.bundle_check"
CHILD_TUNEPILOT_MODULES = {"tunepilot", CHECK_MODULE}
"""The only tunepilot modules the child may import: the package root (a version string) and
the checker, which uses the standard library, transformers, peft, safetensors and torch."""
DEFAULT_TIMEOUT_S = 900.0
CONTROL_COUNT = 8


def choose_controls(examples: list[Example], n: int = CONTROL_COUNT) -> list[Example]:
    """`n` examples chosen by a hash of their id, round-robin over labels: the same data always
    gives the same controls, and a classifier's controls cover several classes."""
    by_label: dict[str, list[Example]] = {}
    for e in sorted(examples, key=lambda e: hashlib.sha256(e.id.encode("utf-8")).hexdigest()):
        by_label.setdefault(str(e.label), []).append(e)
    queues = [by_label[k] for k in sorted(by_label)]
    chosen: list[Example] = []
    while len(chosen) < n and any(queues):
        for queue in queues:
            if queue and len(chosen) < n:
                chosen.append(queue.pop(0))
    return chosen


def compute_controls(
    model: Any, encoder: Any, examples: list[Example], max_new_tokens: int
) -> dict[str, Any]:
    """What the in-memory model answers to each control input: logits and label, or the greedy
    text. One example at a time (no padding), inputs as token ids *and* as text, so the check
    can tell a changed tokenizer from a changed model."""
    import torch

    tokenizer = encoder.tokenizer
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    inputs: list[dict[str, Any]] = []
    try:
        with torch.no_grad():
            for e in examples:
                if encoder.kind == "classification":
                    inputs.append(_classification_control(model, encoder, e, device))
                else:
                    inputs.append(
                        _generation_control(model, encoder, tokenizer, e, device, max_new_tokens)
                    )
    finally:
        model.train(was_training)
    out: dict[str, Any] = {"kind": encoder.kind, "device": device.type, "inputs": inputs}
    if encoder.kind == "classification":
        out["labels"] = list(encoder.label_names)
        out["model_inputs"] = "input_ids and attention_mask (token_type_ids left to the model)"
    return out


def _classification_control(model: Any, encoder: Any, e: Example, device: Any) -> dict[str, Any]:
    import torch

    encoded = encoder.encode(e)
    text, pair = encoder.segments(e)  # exactly the segments training tokenized
    ids = torch.tensor([encoded.input_ids], device=device)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    pred = int(logits.argmax())
    return {
        "id": e.id,
        "text": text,
        "text_pair": pair,
        "max_length": encoder.max_length,
        "input_ids": list(encoded.input_ids),
        "gold_label": e.label,
        "expected_label": encoder.label_names[pred],
        "logits": logits.cpu().tolist(),
    }


def _generation_control(
    model: Any, encoder: Any, tokenizer: Any, e: Example, device: Any, max_new_tokens: int
) -> dict[str, Any]:
    import torch

    prompt = encoder.prompt_ids(e)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    ids = torch.tensor([prompt], device=device)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        pad_token_id=pad,
        eos_token_id=eos,
    )[0, len(prompt) :].tolist()
    new = out[: out.index(eos)] if eos in out else out
    return {
        "id": e.id,
        "prompt_text": encoder.render_prompt(e),
        "add_special_tokens": not encoder.uses_chat_template,
        "max_length": encoder.max_length,
        "input_ids": list(prompt),
        "max_new_tokens": max_new_tokens,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "expected_ids": new,
        "expected_text": tokenizer.decode(new, skip_special_tokens=True),
        "reference_answer": encoder.answer_text(e),
    }


def run_bundle_check(
    bundle_dir: Path, base: Path | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, Any]:
    """Run the checker in a fresh interpreter; returns its JSON payload plus `returncode`."""
    from tunepilot.base_model import ALLOW_DOWNLOAD_ENV

    cmd = [sys.executable, "-P", "-m", CHECK_MODULE, str(bundle_dir)]
    if base is not None:
        cmd += ["--base", str(base)]
    env = dict(os.environ)
    if env.get(ALLOW_DOWNLOAD_ENV) != "1":
        env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
    )
    try:
        payload = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        payload = {}
    payload["returncode"] = done.returncode
    payload["stderr_tail"] = done.stderr[-2000:]
    return payload


def verify_bundle(
    bundle_dir: Path, base: Path | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[Finding]:
    """R2, R4: every hash, every file type, the base (P4), then reload and replay, in a new
    process. Returns findings; a FAIL names the file or the control input that differs."""
    bundle_dir = Path(bundle_dir)
    if not bundle_dir.is_dir():
        raise input_error(
            str(bundle_dir),
            "no such bundle folder",
            "give the folder written by `tunepilot export`",
        )
    payload = run_bundle_check(bundle_dir.resolve(), base, timeout_s)
    if payload["returncode"] != 0 or "findings" not in payload:
        tail = payload["stderr_tail"].strip().splitlines()[-3:]
        return [
            Finding(
                "reload process",
                Verdict.FAIL,
                f"the check process (`python -m "
                f"{CHECK_MODULE}`) exited {payload['returncode']} without a result: "
                f"{' | '.join(tail)}",
                "R2",
            )
        ]
    findings = [
        Finding(
            f["check"],
            Verdict(f["verdict"]),
            f["sentence"],
            f["requirement"],
            list(f.get("examples") or []),
            dict(f.get("details") or {}),
        )
        for f in payload["findings"]
    ]
    loaded = sorted(payload.get("tunepilot_modules") or [])
    extra = sorted(set(loaded) - CHILD_TUNEPILOT_MODULES)
    if extra:
        findings.append(
            Finding(
                "isolation",
                Verdict.FAIL,
                f"the check process imported "
                f"tunepilot code beyond the checker ({', '.join(extra[:5])}): a "
                "PASS would not prove plain transformers + peft can load it",
                "R2",
                extra,
            )
        )
    else:
        findings.append(
            Finding(
                "isolation",
                Verdict.PASS,
                f"checked in a new process (pid "
                f"{payload.get('pid')}, {payload.get('seconds')} s) whose only "
                f"tunepilot modules were {', '.join(loaded)}",
                "R2",
                details={"tunepilot_modules": loaded, "stack": payload.get("stack") or {}},
            )
        )
    return findings


def verification_path(bundle_dir: Path) -> Path:
    """Where the last reload check of a bundle is kept (read by the dossier, L5)."""
    bundle_dir = Path(bundle_dir).resolve()
    return bundle_dir.parent / f"{bundle_dir.name}.verification.json"


def record_verification(bundle_dir: Path, payload: dict[str, Any]) -> None:
    import datetime

    path = verification_path(bundle_dir)
    tmp = path.with_suffix(".tmp")
    stamped = {**payload, "at": datetime.datetime.now(datetime.UTC).isoformat()}
    tmp.write_text(json.dumps(stamped, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)


def verify_command(bundle_dir: Path, as_json: bool, base: Path | None = None) -> int:
    """Body of `tunepilot verify DIR [--base FOLDER] [--json]`; exit 1 on any FAIL."""
    from tunepilot.console import print_findings, print_json
    from tunepilot.verdict import exit_code, worst

    findings = verify_bundle(bundle_dir, base)
    payload = {
        "bundle": str(Path(bundle_dir).resolve()),
        "verdict": str(worst(findings)),
        "findings": [f.to_json() for f in findings],
    }
    # Beside the bundle, never inside it: the bundle's manifest lists exactly what it holds.
    record_verification(Path(bundle_dir), payload)
    if as_json:
        print_json(payload)
    else:
        print_findings(findings, f"reload check of {bundle_dir} (R2, R4, P4)")
    return exit_code(findings)


def export_command(ws: Workspace, run_id: str, out: Path | None, as_json: bool) -> int:
    """Body of `tunepilot export RUN [CAMPAIGN] [--out DIR] [--json]`."""
    from tunepilot.console import console, print_json
    from tunepilot.export import export_run

    folder = export_run(ws, run_id, out)
    manifest = json.loads((folder / "MANIFEST.json").read_text(encoding="utf-8"))
    if as_json:
        print_json({"run_id": run_id, "bundle": str(folder), "files": manifest["files"]})
    else:
        console.print(
            f"exported {run_id} to [bold]{folder}[/] ({len(manifest['files'])} files, "
            f"sha256 in MANIFEST.json); check it with `tunepilot verify {folder}`"
        )
    return 0
