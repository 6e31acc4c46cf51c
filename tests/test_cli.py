"""The real `tunepilot` entry point: exit codes 0/1/2, --help without torch, init, validate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TUNEPILOT = [sys.executable, "-m", "tunepilot.cli"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*TUNEPILOT, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_help_lists_commands_and_examples_without_importing_torch():
    code = (
        "import sys\n"
        "from tunepilot.cli import app\n"
        "try:\n    app(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "validate" in out.stdout and "Examples" in out.stdout
    assert "tunepilot init my-campaign --task classification" in out.stdout


def test_init_then_validate_exit_0(tmp_path):
    result = run("init", str(tmp_path / "c"), "--task", "extraction")
    assert result.returncode == 0, result.stderr
    campaign = tmp_path / "c" / "campaign.yaml"
    assert campaign.read_text().startswith(f"# Run me:  tunepilot pilot {tmp_path / 'c'}")
    # the template points at data the user has not written yet: validate says so, exit 2
    result = run("validate", str(campaign))
    assert result.returncode == 2
    assert "data.file" in result.stderr and "no such file" in result.stderr


def test_validate_ok_prints_summary_exit_0(tmp_path):
    assert run("init", str(tmp_path), "--task", "classification").returncode == 0
    (tmp_path / "data").mkdir()
    rows = [{"id": f"t{i}", "text": f"ticket {i} about my order", "queue": "qa"[i % 2],
             "conversation_id": f"c{i}", "created_at": f"2026-01-{1 + i % 28:02d}"}
            for i in range(200)]  # validate reads the data: the plan is judged on it (S7)
    (tmp_path / "data" / "tickets.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run("validate", str(tmp_path / "campaign.yaml"), "training.lr=5e-5", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["ok"] and payload["campaign"]["training"]["lr"] == 5e-5
    assert payload["plan"][0]["verdict"] == "PASS"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["validate", "no-such-campaign.yaml"], "no such campaign file"),
        (["init", "{tmp}", "--task", "regression"], "unknown task"),
        (["validate", "{tmp}/campaign.yaml", "notanoverride"], "key.path=value"),
        (["validate", "{tmp}/campaign.yaml", "training.lr=-1"], "training.lr"),
        (["validate", "{tmp}/campaign.yaml", "model.methd=full"], "did you mean `method`"),
    ],
)
def test_bad_input_exits_2_with_the_key_and_fix(tmp_path, args, needle):
    assert run("init", str(tmp_path), "--task", "classification").returncode == 0
    result = run(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert needle in result.stderr
    assert "fix:" in result.stderr


def test_init_refuses_to_overwrite_a_campaign(tmp_path):
    assert run("init", str(tmp_path)).returncode == 0
    result = run("init", str(tmp_path))
    assert result.returncode == 2 and "--force" in result.stderr


def test_schema_is_valid_json_schema_with_every_section():
    result = run("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert set(schema["properties"]) >= {"name", "hypothesis", "model", "data", "training",
                                         "variants", "seeds", "rental"}


def test_usage_error_exits_2():
    assert run("no-such-command").returncode == 2
