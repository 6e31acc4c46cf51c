"""`--json` means stdout is exactly one JSON document, for every command that has the flag.

The commands are discovered from the app itself, so a new command with `--json` and no case
here fails the test. Each runs as the user runs it (a new process) on a tiny BERT campaign,
including `runs` right after a run's process died (its "marked ... interrupted" note must go
to stderr) and the error path (bad input still answers in JSON, exit 2).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_sweep import write_sweep_campaign

TUNEPILOT = [sys.executable, "-m", "tunepilot.cli"]


def commands_with_json() -> set[str]:
    import typer

    from tunepilot.cli import app

    found: set[str] = set()

    def walk(command, prefix: tuple[str, ...]) -> None:
        for name, sub in (getattr(command, "commands", None) or {}).items():
            if any("--json" in getattr(p, "opts", ()) for p in sub.params):
                found.add(" ".join((*prefix, name)))
            walk(sub, (*prefix, name))

    walk(typer.main.get_command(app), ())
    return found


def test_json_flag_is_discovered_on_every_command_that_prints_results():
    found = commands_with_json()
    assert {"validate", "data audit", "run", "runs", "compare", "export", "report"} <= found


def plant_dead_run(campaign_file: Path) -> None:
    """A run whose process is gone: the next command that opens the ledger marks it."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.ledger import Ledger

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    ws = Workspace.open(campaign_file)
    with Ledger.open(ws.ledger_path) as ledger:
        rid = ledger.register_run(campaign="sweep", variant="lr-2e-3", seed=0, config_hash="c",
                                  data_version="d")  # fmt: skip
        ledger.set_status(rid, "running", "started", pid=gone.pid)
        ledger.heartbeat(rid, pid=gone.pid)


@pytest.mark.slow
def test_json_every_command_prints_exactly_one_json_document(tmp_path: Path, tiny_bert_dir):
    campaign = write_sweep_campaign(tmp_path / "c", tiny_bert_dir, n=45)
    c, bundle = str(campaign), str(tmp_path / "c" / "exports" / "control-s0-1")
    steps = [  # in the order a campaign uses them; (command, arguments, exit codes allowed)
        ("validate", [c], {0}),
        ("data audit", [c], {0, 1}),
        ("data show", [c, "-n", "1"], {0}),
        ("baseline", [c], {0}),
        ("run", [c, "--variant", "control", "--seeds", "0", "--stop-after", "2"], {0}),
        ("runs", [c], {0}),
        ("resume", ["control-s0-1", c], {0}),
        ("compare", [c], {0, 1}),
        ("test", ["--final", "control-s0-1", c], {0, 1}),
        ("export", ["control-s0-1", c], {0, 1}),
        ("verify", [bundle], {0}),
        ("pilot", [c], {0, 1}),
        ("plan", [c], {0, 1}),
        ("size", [c], {0, 1}),
        ("report", [c], {0}),
        ("archive", [str(campaign.parent), str(tmp_path / "backup.tar")], {0}),
        ("restore", [str(tmp_path / "backup.tar"), str(tmp_path / "restored")], {0}),
    ]
    assert {name for name, _, _ in steps} == commands_with_json()
    for name, args, allowed in steps:
        if name == "runs":
            plant_dead_run(campaign)
        result = subprocess.run([*TUNEPILOT, *name.split(), *args, "--json"],
                                capture_output=True, text=True, timeout=600)  # fmt: skip
        assert result.returncode in allowed, (name, result.stderr[-2000:])
        try:
            json.loads(result.stdout)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"{name}: stdout is not one JSON document ({exc}): "
                                 f"{result.stdout[:300]!r}") from None  # fmt: skip
        if name == "runs":
            assert "interrupted" in result.stderr  # the note went to stderr, not stdout
    bad = subprocess.run([*TUNEPILOT, "run", c, "--seeds", " ", "--json"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and json.loads(bad.stdout)["problems"][0]["where"] == "--seeds"


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["run", "campaign.yaml", "--stop-after", "-3"], "--stop-after"),
        (["run", "campaign.yaml", "--no-such-option"], "--no-such-option"),
        (["data", "audit", "campaign.yaml", "--split", "x"], "--split"),
        (["no-such-command"], "command line"),
    ],
)
def test_json_a_usage_error_under_json_is_one_json_document_exit_2(tmp_path, args, where):
    """The command line's own refusals (an option out of range, an unknown option or command)
    come before any command runs; under --json they still answer in JSON, not on stderr only."""
    args = [str(tmp_path / a) if a.endswith(".yaml") else a for a in args]
    result = subprocess.run([*TUNEPILOT, *args, "--json"], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stderr
    payload = json.loads(result.stdout)
    assert payload["exit_code"] == 2 and payload["problems"][0]["where"] == where
    assert "--help" in payload["problems"][0]["fix"] and "Traceback" not in result.stderr
