"""B2: the versions really used are read from the machine, and a change is named (B1)."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tunepilot.measure.env import fingerprint, fingerprint_diff, git_commit, git_state


def test_b2_fingerprint_records_real_versions() -> None:
    import torch

    fp = fingerprint(extra_packages=["pyyaml"])
    json.dumps(fp)  # env.json must be writable as is
    assert fp["python"]["version"] == platform.python_version()
    assert fp["torch"]["version"] == torch.__version__
    assert fp["torch"]["cuda"] == torch.version.cuda
    assert fp["torch"]["backend"] in {"cpu", "cuda", "rocm"}
    assert fp["packages"]["transformers"] == importlib.metadata.version("transformers")
    assert fp["packages"]["peft"] == importlib.metadata.version("peft")
    assert fp["packages"]["pyyaml"] == importlib.metadata.version("pyyaml")
    assert fp["cpu"]["cores_logical"] >= 1 and fp["cpu"]["model"]
    assert len(fp["devices"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if not torch.cuda.is_available():
        assert fp["torch"]["backend"] == "cpu"


def test_b2_absent_package_is_recorded_as_none() -> None:
    fp = fingerprint(extra_packages=["surely-not-installed-pkg"])
    assert fp["packages"]["surely-not-installed-pkg"] is None


def test_b2_package_versions_import_nothing_heavy() -> None:
    code = (
        "import sys; from tunepilot.measure.env import package_versions; "
        "v = package_versions(['transformers', 'peft']); "
        "print(v['transformers'] is not None, 'transformers' in sys.modules, 'peft' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False", "False"]


def test_b1_fingerprint_diff_names_what_changed() -> None:
    old = fingerprint()
    assert fingerprint_diff(old, fingerprint()) == []
    new = copy.deepcopy(old)
    new["torch"]["version"] = "9.9.9"
    new["devices"] = [*old["devices"], {"name": "NVIDIA H100", "total_memory_bytes": 80}]
    new["python"]["executable"] = "/elsewhere/python"  # a copied venv is the same stack
    lines = fingerprint_diff(old, new)
    assert f"torch.version: {old['torch']['version']!r} -> '9.9.9'" in lines
    assert any(line.startswith("devices.count:") for line in lines)
    assert any("NVIDIA H100" in line for line in lines)
    assert not any(line.startswith("python.executable") for line in lines)


def test_b2_git_commit_of_a_repository(tmp_path: Path) -> None:
    assert git_commit(tmp_path) is None
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.txt").write_text("a")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert git_commit(tmp_path) == head.stdout.strip()
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "a.txt").write_text("changed")
    assert git_state(tmp_path)["dirty"] is True
    sub = tmp_path / "models" / "base"
    sub.mkdir(parents=True)
    assert git_commit(sub) == head.stdout.strip()
    assert git_commit(sub, require_root=True) is None  # not credited with the project's commit


AMD_SMI_LINE = ("AMDSMI Tool: 26.1.0+cd50d9e0 | AMDSMI Library version: 26.1.0 | ROCm version: "
                "7.10.0 | amdgpu version: 6.16.6 | amd_hsmp version: N/A")  # fmt: skip
ROCM_SMI_OUTPUT = """
============================ ROCm System Management Interface ============================
=============================== Version of System Component ===============================
Driver version: 6.7.0
===========================================================================================
=================================== End of ROCm SMI Log ===================================
"""


def _tool(folder: Path, name: str, output: str) -> None:
    script = folder / name
    quoted = output.strip().replace("'", "'\\''")
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' '{quoted}'\n")  # a shell builtin: PATH is bare
    script.chmod(0o755)


def test_b2_rocm_driver_and_release_read_from_a_stand_in_amd_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No AMD GPU here: a stand-in `amd-smi` prints the line the real tool prints (its docs)."""
    from tunepilot.measure.env import driver_version

    _tool(tmp_path, "amd-smi", AMD_SMI_LINE)
    monkeypatch.setenv("PATH", str(tmp_path))
    driver = driver_version()
    assert (driver["vendor"], driver["version"], driver["rocm"]) == ("amd", "6.16.6", "7.10.0")
    assert driver["tool"] == "amd-smi 26.1.0+cd50d9e0" and driver["error"] is None


def test_b2_rocm_driver_read_from_a_stand_in_rocm_smi_when_amd_smi_is_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tunepilot.measure.env import driver_version

    _tool(tmp_path, "rocm-smi", ROCM_SMI_OUTPUT)
    monkeypatch.setenv("PATH", str(tmp_path))
    driver = driver_version()
    assert (driver["vendor"], driver["version"], driver["tool"]) == ("amd", "6.7.0", "rocm-smi")


def test_b2_nccl_or_rccl_version_from_a_stand_in_torch_build_and_none_on_this_cpu_build() -> None:
    """The CPU wheel here links no collective library (gloo only): nothing is claimed. A CUDA
    or ROCm build answers `torch.cuda.nccl.version()`, stood in for by a namespace."""
    from types import SimpleNamespace

    import torch

    from tunepilot.measure.env import collective_library, fingerprint

    assert collective_library(torch) == {} and "nccl" not in (fingerprint()["torch"] or {})

    def build(cuda: str | None, hip: str | None) -> SimpleNamespace:
        nccl = SimpleNamespace(version=lambda: (2, 21, 5))
        return SimpleNamespace(version=SimpleNamespace(cuda=cuda, hip=hip),
                               cuda=SimpleNamespace(nccl=nccl))  # fmt: skip

    assert collective_library(build("12.4", None)) == {"nccl": "2.21.5"}
    assert collective_library(build(None, "6.2.41133")) == {"rccl": "2.21.5"}


def test_b2_kernel_packages_are_recorded_when_installed_and_left_out_when_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real distribution's metadata (a dist-info folder on sys.path) is what is read."""
    import sys

    from tunepilot.measure.env import OPTIONAL_PACKAGES, fingerprint

    info = tmp_path / "liger_kernel-0.5.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: liger-kernel\nVersion: 0.5.2\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    packages = fingerprint()["packages"]
    assert packages["liger-kernel"] == "0.5.2"
    assert set(OPTIONAL_PACKAGES) == {"flash-attn", "bitsandbytes", "triton", "liger-kernel",
                                      "deepspeed"}  # fmt: skip
    for name in set(OPTIONAL_PACKAGES) - {"liger-kernel"}:
        assert name not in packages  # not installed here: not claimed as None either
