"""The backend fingerprint (B2): the versions a run really used, read from the machine.

"The cuda12 image" or "the usual venv" is a name, not a fact: the same name can hold another
torch build, driver or card. Every run writes `fingerprint()` to its `env.json`, and a pilot
compares the fingerprint it was made on with the current one (`fingerprint_diff`, B1): a
changed backend, driver or device means the start-up and quality checks must be redone.

Package versions come from `importlib.metadata`, so recording them imports nothing heavy.
torch is the exception: CUDA/ROCm versions and device properties can only be asked of it; it
is imported inside `fingerprint` (only commands that train call it). No timestamps go in, so
two fingerprints of the same machine are equal and every diff line means something.

What a step really ran on: the GPU driver from the driver's own tool (nvidia-smi; amd-smi, or
rocm-smi where it is older, which also names the ROCm release), the collective library the
torch build links (NCCL, or RCCL on ROCm), and the kernel packages that change a step when
they are installed (flash-attn, bitsandbytes, triton, liger-kernel, deepspeed).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DEFAULT_PACKAGES = (
    "torch",
    "transformers",
    "peft",
    "safetensors",
    "tokenizers",
    "accelerate",
    "huggingface-hub",
    "numpy",
    "tunepilot",
)
OPTIONAL_PACKAGES = ("flash-attn", "bitsandbytes", "triton", "liger-kernel", "deepspeed")
"""Kernels and engines that change what a step computes or how fast: recorded when present."""

_SUBPROCESS_TIMEOUT_S = 10


def package_versions(names: Iterable[str]) -> dict[str, str | None]:
    """Installed version of each distribution, None when absent; nothing is imported."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str:
    """The CPU's marketing name; `platform.processor()` is often empty on Linux."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _cores_available() -> int | None:
    """Cores this process may use (affinity, containers), which can be fewer than exist."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def _run(cmd: list[str]) -> tuple[str | None, str | None]:
    """(stdout, None) on success, (None, why) otherwise: a missing driver is data, not a crash."""
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=_SUBPROCESS_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{cmd[0]}: {exc}"
    if done.returncode != 0:
        return None, f"{cmd[0]} exited {done.returncode}: {done.stderr.strip()[:200]}"
    return done.stdout.strip(), None


def driver_version() -> dict[str, str | None]:
    """The GPU driver as the driver's own tool reports it: nvidia-smi on NVIDIA; amd-smi (or
    the older rocm-smi) on AMD, with the ROCm release amd-smi names. None without one."""
    if shutil.which("nvidia-smi"):
        out, why = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        if out:
            return {"vendor": "nvidia", "version": out.splitlines()[0].strip(), "error": None}
        return {"vendor": "nvidia", "version": None, "error": why}
    if shutil.which("amd-smi"):
        out, why = _run(["amd-smi", "version"])
        fields = parse_amd_smi_version(out or "")
        version = fields.get("amdgpu version")
        if version is None and shutil.which("rocm-smi"):
            version = rocm_smi_driver_version(_run(["rocm-smi", "--showdriverversion"])[0] or "")
        return {"vendor": "amd", "version": version, "rocm": fields.get("rocm version"),
                "tool": "amd-smi " + fields.get("amdsmi tool", "?"),
                "error": None if version else why or "amd-smi named no amdgpu version"}
    if shutil.which("rocm-smi"):
        out, why = _run(["rocm-smi", "--showdriverversion"])
        version = rocm_smi_driver_version(out or "")
        return {"vendor": "amd", "version": version, "rocm": None, "tool": "rocm-smi",
                "error": None if version else why or "rocm-smi named no driver version"}
    return {"vendor": None, "version": None, "error": None}


def parse_amd_smi_version(text: str) -> dict[str, str]:
    """`AMDSMI Tool: 26.1.0+cd50d9e0 | AMDSMI Library version: 26.1.0 | ROCm version: 7.10.0 |
    amdgpu version: 6.16.6 | amd_hsmp version: N/A` -> {"rocm version": "7.10.0", ...}, keys
    lower-cased; "N/A" values left out."""
    out: dict[str, str] = {}
    for part in text.strip().splitlines()[0].split("|") if text.strip() else []:
        key, sep, value = part.partition(":")
        if sep and value.strip() and value.strip().upper() != "N/A":
            out[key.strip().lower()] = value.strip()
    return out


def rocm_smi_driver_version(text: str) -> str | None:
    """The value of rocm-smi's `Driver version: 6.7.0` line, None when absent."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower().endswith("driver version") and value.strip():
            return value.strip()
    return None


def collective_library(torch: Any) -> dict[str, str | None]:
    """The collective library the torch build links: NCCL on CUDA, RCCL on ROCm (torch asks
    the same `torch.cuda.nccl.version()` for both). Empty on a CPU build (gloo only)."""
    hip = getattr(torch.version, "hip", None)
    if not (torch.version.cuda or hip):
        return {}
    name = "rccl" if hip else "nccl"
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError) as exc:  # a build without it, or no driver
        return {name: None, f"{name}_error": str(exc)[:200]}
    if isinstance(version, tuple):
        version = ".".join(str(x) for x in version)
    return {name: str(version)}


def _torch_info() -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """torch build (CUDA / HIP / cuDNN versions) and the visible accelerator devices."""
    try:
        import torch
    except ImportError:
        return None, []
    hip = getattr(torch.version, "hip", None)
    cuda = torch.version.cuda
    backend = "rocm" if hip else "cuda" if cuda else "cpu"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    info: dict[str, Any] = {
        "version": torch.__version__,
        "backend": backend,
        "cuda": cuda,
        "hip": hip,
        "cudnn": cudnn,
        "debug": bool(torch.version.debug),
        # CPU sums are split across intra-op threads: a different count can change the last
        # bits of a loss (measured on MiniLM: 1.8e-7), so it belongs to a run's identity.
        "intra_op_threads": torch.get_num_threads(),
        **collective_library(torch),
    }
    devices: list[dict[str, Any]] = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            # Properties are read without making the device current: entering each GPU (as
            # `torch.cuda.device(index)` does) would create a CUDA context, ~500 MiB, on
            # every card the process sees, also on the ones other ranks train on.
            props = torch.cuda.get_device_properties(index)
            bf16 = bool(hip) or props.major >= 8  # native bf16: Ampere (8.0) and later; ROCm
            devices.append(
                {
                    "index": index,
                    "name": props.name,
                    "total_memory_bytes": int(props.total_memory),
                    "capability": f"{props.major}.{props.minor}",
                    "multiprocessors": int(props.multi_processor_count),
                    "bf16_supported": bool(bf16),
                    "arch": getattr(props, "gcnArchName", None),
                }
            )
    return info, devices


def fingerprint(extra_packages: Iterable[str] = ()) -> dict[str, Any]:
    """What this process runs on: interpreter, OS, CPU, torch build, driver, devices, packages.

    Deterministic for a given machine (no timestamps, no process ids), so equal machines give
    equal dicts and `fingerprint_diff` only names real changes.
    """
    torch_info, devices = _torch_info()
    packages = list(dict.fromkeys([*DEFAULT_PACKAGES, *extra_packages]))
    present = {k: v for k, v in package_versions(OPTIONAL_PACKAGES).items() if v is not None}
    return {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "platform": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "os": platform.platform(),
        },
        "cpu": {
            "model": cpu_model(),
            "cores_logical": os.cpu_count(),
            "cores_available": _cores_available(),
        },
        "torch": torch_info,
        "driver": driver_version(),
        "visible_devices": {
            key: os.environ.get(key)
            for key in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
        },
        "devices": devices,
        "packages": {**package_versions(packages), **present},
    }


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts/lists -> {"a.b.0.c": leaf} so two fingerprints compare key by key."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list):
        out = {f"{prefix}.count": len(value)}
        for i, item in enumerate(value):
            out.update(_flatten(item, f"{prefix}.{i}"))
        return out
    return {prefix: value}


def fingerprint_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line per changed, added or removed entry: "torch.version: 2.13.0+cpu -> 2.14.1".

    The B1 stale check: an empty list means the same stack; anything else names what to
    re-check. The interpreter path is ignored (a copied venv is the same stack); its version
    is not.
    """
    ignored = {"python.executable"}
    a, b = _flatten(old), _flatten(new)
    lines = []
    for key in sorted(set(a) | set(b)):
        if key in ignored:
            continue
        if key not in a:
            lines.append(f"{key}: (absent) -> {b[key]!r}")
        elif key not in b:
            lines.append(f"{key}: {a[key]!r} -> (absent)")
        elif a[key] != b[key]:
            lines.append(f"{key}: {a[key]!r} -> {b[key]!r}")
    return lines


def git_state(folder: str | Path, require_root: bool = False) -> dict[str, Any] | None:
    """{"commit", "dirty", "root"} of the git work tree holding `folder`, or None.

    `require_root=True` answers only when `folder` is the top of the work tree: a model folder
    that merely sits inside the user's project repository must not be credited with the
    project's commit (a git clone of a hub repo, however, is its own root).
    """
    folder = Path(folder)
    if not folder.is_dir() or shutil.which("git") is None:
        return None
    root, _ = _run(["git", "-C", str(folder), "rev-parse", "--show-toplevel"])
    if root is None:
        return None
    if require_root and Path(root).resolve() != folder.resolve():
        return None
    commit, _ = _run(["git", "-C", str(folder), "rev-parse", "HEAD"])
    if commit is None:  # a repository without commits yet
        return None
    status, _ = _run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"])
    return {"commit": commit, "dirty": bool(status), "root": root}


def git_commit(folder: str | Path, require_root: bool = False) -> str | None:
    """The HEAD commit of the repository holding `folder`, None when it is not one."""
    state = git_state(folder, require_root=require_root)
    return state["commit"] if state else None


def backend_of(env: dict[str, Any] | None) -> str | None:
    """The backend a fingerprint ran on, as runs are compared by it (B1): the torch build's
    kind (cpu, cuda, rocm) and the accelerator model(s), e.g. "cuda: NVIDIA H100 80GB HBM3";
    None when the fingerprint does not say (an older run, a file lost)."""
    if not isinstance(env, dict) or not isinstance(env.get("torch"), dict):
        return None
    kind = env["torch"].get("backend") or "cpu"
    names = sorted({str(d.get("name")) for d in env.get("devices") or [] if isinstance(d, dict)})
    own = str(kind) if kind == "cpu" or not names else f"{kind}: {' + '.join(names)}"
    # a run resumed on another backend (resume --allow-backend-change) ran on both
    later = [backend_of(e) for e in env.get("resumed_on") or [] if isinstance(e, dict)]
    return " then ".join(dict.fromkeys([own, *(b for b in later if b)]))


def backend_change(before: dict[str, Any] | None, now: dict[str, Any] | None) -> str | None:
    """Why two fingerprints are not one backend (B1), or None when they are (or one is
    unknown): numbers from another kernel library or card are not the same measurement, and
    a platform change means redoing the start-up and quality checks."""
    a, b = backend_of(before), backend_of(now)
    if a is None or b is None or a == b:
        return None
    return f"{a} -> {b}"


def read_env(folder: str | Path) -> dict[str, Any] | None:
    """A run's recorded fingerprint (`env.json`), None when absent or unreadable."""
    import json

    try:
        value = json.loads((Path(folder) / "env.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
