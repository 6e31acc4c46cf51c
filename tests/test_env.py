"""B2: the versions really used are read from the machine, and a change is named (B1)."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import platform
import subprocess
import sys
from pathlib import Path

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
