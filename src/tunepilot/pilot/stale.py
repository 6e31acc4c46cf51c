"""Gate 1, the environment: what this backend really is, whether earlier results still hold on
it, and whether the extensions the campaign relies on run here (B1, B2, L2).

- The fingerprint (B2) is compared with the last pilot's in this campaign. A change (another
  torch build, driver, device or package) makes the earlier pilot's gates stale: its folder
  gets a STALE.json naming the change and the pilot that found it, and the row lists what to
  redo: every gate of the pilot (this run redoes them) and the quality checks (baseline,
  control runs) recorded on the old backend (B1).
- `measured_card` names the catalog card this backend is, so the plan knows whether its
  times were measured on the card it plans for.
- Extensions are exercised on a tiny tensor on this device, because a preference written in a
  campaign (`attn_implementation: flash_attention_2`, bf16) does not prove the stack runs it
  (L2): scaled-dot-product attention, flash-attn, bf16 autocast, fp16 (CUDA only), AdamW
  (fused on CUDA), and the collective backend when the campaign is distributed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tunepilot.measure.env import fingerprint, fingerprint_diff
from tunepilot.pilot.phases import Outcome, PilotState, worst_verdict
from tunepilot.verdict import Verdict

STALE_FILE = "STALE.json"
REDO = (
    "every pilot gate (this pilot redoes them), then the baseline and the control runs made on "
    "the old backend: their numbers are not comparable with new ones (B1)"
)


def previous_pilot(pilots_dir: Path, exclude: str) -> Path | None:
    """The newest other pilot folder with a gates.json; ids sort by their timestamp."""
    if not pilots_dir.is_dir():
        return None
    found = sorted(
        p for p in pilots_dir.iterdir() if p.name != exclude and (p / "gates.json").is_file()
    )
    return found[-1] if found else None


def runs_on_other_backends(runs_dir: Path, env: dict[str, Any]) -> list[str]:
    """Run ids whose env.json differs from `env`: their quality checks must be redone (B1)."""
    if not runs_dir.is_dir():
        return []
    out = []
    for run in sorted(runs_dir.iterdir()):
        path = run / "env.json"
        if path.is_file():
            old = json.loads(path.read_text(encoding="utf-8"))
            old.pop("campaign_git_commit", None)
            if fingerprint_diff(old, env):
                out.append(run.name)
    return out


def mark_stale(previous: Path, pilot_id: str, diff: list[str]) -> None:
    """Write STALE.json into an earlier pilot: its results do not hold on this backend (B1)."""
    payload = {"stale_since": pilot_id, "backend_changes": diff, "redo": REDO}
    (previous / STALE_FILE).write_text(json.dumps(payload, indent=2), encoding="utf-8")


def measured_card(env: dict[str, Any], catalog: Any) -> str:
    """The catalog card this pilot ran on ("cpu" without a GPU): every word of its name
    (memory words aside) in the device name, the closest memory size among matches."""
    devices = env.get("devices") or []
    if not devices:
        return "cpu"
    name, memory = devices[0]["name"].lower(), devices[0]["total_memory_bytes"] / 2**30
    words = set(re.split(r"[^a-z0-9]+", name))  # whole words: an A10G is no A10

    def named(card: Any) -> bool:
        return all(w in words for w in card.name.lower().split() if not w.endswith("gb"))

    matches = [c for c in catalog.cards if named(c)]
    if not matches:
        return str(devices[0]["name"])
    return min(matches, key=lambda c: abs(c.memory_gib - memory)).name


def environment_gate(state: PilotState) -> Outcome:
    """Gate 1: fingerprint, B1 staleness against the last pilot, extensions exercised."""
    env = fingerprint()
    state.env = env
    details: dict[str, Any] = {"backend": (env.get("torch") or {}).get("backend"),
                               "device": str(state.device)}  # fmt: skip
    parts: list[str] = []
    verdicts: list[Verdict] = []

    previous = previous_pilot(state.ws.pilots_dir, state.pilot_id)
    old: dict[str, Any] = {}
    if previous is not None:
        old = json.loads((previous / "gates.json").read_text(encoding="utf-8")).get("env") or {}
        if not old:
            parts.append(f"pilot {previous.name} recorded no fingerprint: nothing to compare")
    if previous is not None and old:
        diff = fingerprint_diff(old, env)
        details.update(previous_pilot=previous.name, backend_changes=diff)
        if diff:
            mark_stale(previous, state.pilot_id, diff)
            old_runs = runs_on_other_backends(state.ws.runs_dir, env)
            details.update(stale_pilot=previous.name, redo=REDO, stale_runs=old_runs)
            verdicts.append(Verdict.WARN)
            runs = f"; runs made on another backend: {', '.join(old_runs[:5])}" if old_runs else ""
            parts.append(
                f"the backend changed since pilot {previous.name} ({'; '.join(diff[:3])}"
                f"{' ...' if len(diff) > 3 else ''}): its results are marked stale; redo "
                f"{REDO}{runs}"
            )
        else:
            parts.append(f"same backend as pilot {previous.name}")

    checks = exercise_extensions(state)
    details["extensions"] = checks
    verdicts += [Verdict(c["verdict"]) for c in checks]
    bad = [c for c in checks if c["verdict"] != "PASS"]
    torch_info = env.get("torch") or {}
    devices = env.get("devices") or []
    where = ", ".join(f"{d['name']} ({d['total_memory_bytes'] / 2**30:.0f} GiB)" for d in devices)
    seen = (
        f"python {env['python']['version']}, torch {torch_info.get('version')} "
        f"({torch_info.get('backend')}), {where or 'CPU ' + env['cpu']['model']}"
    )
    ok = [c["name"] for c in checks if c["verdict"] == "PASS"]
    parts.insert(0, f"{seen}; ran on a tiny tensor: {', '.join(ok) or 'nothing'}")
    parts += [c["sentence"] for c in bad]
    return Outcome(worst_verdict(verdicts), "; ".join(parts), details)


def exercise_extensions(state: PilotState) -> list[dict[str, Any]]:
    """Each extension the campaign relies on, run once on this device (L2)."""
    m, t = state.campaign.model, state.training
    checks = [_check_adamw(state.device)]
    if m.attn_implementation:
        checks.append(_check_attention(m.attn_implementation, state.device))
    if t.precision != "fp32":
        checks.append(_check_precision(t.precision, state.device))
    if t.distributed.strategy != "none":
        checks.append(_check_collectives(t.distributed.strategy, t.distributed.nproc, state.device))
    if m.base_dtype in ("nf4", "int8"):
        from tunepilot.model.base_dtype import exercise_bitsandbytes

        ran, sentence = exercise_bitsandbytes(m.base_dtype, state.device)
        checks.append(_result(f"bitsandbytes {m.base_dtype}", Verdict.PASS if ran else Verdict.FAIL,
                              sentence))  # fmt: skip
    return checks


def _result(name: str, verdict: Verdict, sentence: str) -> dict[str, Any]:
    return {"name": name, "verdict": str(verdict), "sentence": sentence}


def _check_adamw(device: Any) -> dict[str, Any]:
    """One AdamW step as the loop runs it; on CUDA also the fused kernel."""
    import torch

    p = torch.nn.Parameter(torch.ones(4, device=device))
    (p * p).sum().backward()
    torch.optim.AdamW([p], lr=1e-3).step()
    if device.type != "cuda":
        return _result("AdamW", Verdict.PASS, "AdamW stepped")
    try:
        q = torch.nn.Parameter(torch.ones(4, device=device))
        (q * q).sum().backward()
        torch.optim.AdamW([q], lr=1e-3, fused=True).step()
    except (RuntimeError, TypeError) as exc:
        return _result("fused AdamW", Verdict.WARN,
                       f"fused AdamW fails here ({str(exc)[:120]}); the loop's default AdamW "
                       "ran, expect slower optimizer steps")  # fmt: skip
    return _result("fused AdamW", Verdict.PASS, "fused AdamW stepped")


def _check_attention(impl: str, device: Any) -> dict[str, Any]:
    """The attention implementation the campaign names, on a (1, 2, 8, 16) tensor."""
    import torch

    if impl == "eager":
        return _result("eager attention", Verdict.PASS, "eager attention needs no extension")
    if impl == "sdpa":
        q = torch.randn(1, 2, 8, 16, device=device)
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        ok = bool(torch.isfinite(out).all())
        return _result("sdpa", Verdict.PASS if ok else Verdict.FAIL,
                       "sdpa ran" if ok else "sdpa returned non-finite values on this device; "
                       "set model.attn_implementation=eager")  # fmt: skip
    if impl.startswith("flash_attention"):
        if device.type != "cuda":
            return _result(impl, Verdict.FAIL,
                           f"model.attn_implementation={impl} needs a CUDA GPU and this pilot runs "
                           f"on {device.type}; set model.attn_implementation=sdpa here, and rerun "
                           "the pilot on the GPU with flash-attn installed")  # fmt: skip
        try:
            from flash_attn import flash_attn_func  # type: ignore[import-not-found]
        except ImportError as exc:
            return _result(impl, Verdict.FAIL,
                           f"model.attn_implementation={impl} but flash_attn does not import "
                           f"({str(exc)[:120]}); `pip install flash-attn --no-build-isolation` "
                           "for this torch and CUDA, or set attn_implementation=sdpa")  # fmt: skip
        try:
            q = torch.randn(1, 8, 2, 64, device=device, dtype=torch.float16)
            flash_attn_func(q, q, q, causal=True)
        except RuntimeError as exc:
            return _result(impl, Verdict.FAIL,
                           f"flash_attn imports but fails on this GPU ({str(exc)[:160]}); set "
                           "model.attn_implementation=sdpa")  # fmt: skip
        return _result(impl, Verdict.PASS, "flash-attn ran")
    return _result(impl, Verdict.WARN,
                   f"model.attn_implementation={impl} is not exercised by the pilot; the load and "
                   "step gates below show whether the model runs with it")  # fmt: skip


def _check_precision(precision: str, device: Any) -> dict[str, Any]:
    """bf16 autocast on this device; fp16 only on CUDA (the loop refuses it elsewhere)."""
    import torch

    if precision == "fp16" and device.type != "cuda":
        return _result("fp16", Verdict.FAIL,
                       f"training.precision=fp16 needs CUDA and this pilot runs on {device.type}; "
                       "use training.precision=bf16 or fp32 here")  # fmt: skip
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return _result("bf16", Verdict.FAIL,
                       f"{torch.cuda.get_device_name(device)} has no bf16; use "
                       "training.precision=fp16 (with loss scaling) or fp32")  # fmt: skip
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    a = torch.randn(8, 8, device=device)
    with torch.autocast(device.type, dtype=dtype):
        out = a @ a
    ok = out.dtype == dtype and bool(torch.isfinite(out).all())
    return _result(precision, Verdict.PASS if ok else Verdict.FAIL,
                   f"{precision} autocast ran" if ok else f"{precision} autocast gave {out.dtype}; "
                   "use training.precision=fp32")  # fmt: skip


def _check_collectives(strategy: str, nproc: int, device: Any) -> dict[str, Any]:
    """torch.distributed and its backend for the campaign's strategy (B3, B4)."""
    import torch

    dist = torch.distributed
    if not dist.is_available():
        return _result(strategy, Verdict.FAIL,
                       f"training.distributed.strategy={strategy} but this torch has no "
                       "torch.distributed; install a build with it")  # fmt: skip
    backend = "nccl" if device.type == "cuda" else "gloo"
    have = dist.is_nccl_available() if backend == "nccl" else dist.is_gloo_available()
    if not have:
        return _result(strategy, Verdict.FAIL, f"{backend} is not available for {strategy}")
    visible = torch.cuda.device_count() if device.type == "cuda" else nproc
    if visible < nproc:
        said = f"{strategy} asks for {nproc} processes but {visible} GPU(s) are visible"
        return _result(strategy, Verdict.WARN, f"{said}; rerun the pilot on the full machine")
    return _result(strategy, Verdict.PASS,
                   f"{backend} is available for {strategy} x {nproc}; the pilot runs one "
                   "process: the gates below are per replica")  # fmt: skip
