"""Output people expect: help examples one a line, whole columns in logs and pipes, progress
with rate and ETA on stderr only, a start line per pilot gate (issue 12, item 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pilot_support import tiny_campaign
from tunepilot.data.workspace import Workspace

ENV = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "CI")}


def test_issue12_5_top_level_help_keeps_one_example_per_line():
    out = subprocess.run([sys.executable, "-m", "tunepilot.cli", "--help"], capture_output=True,
                         text=True, env=ENV, timeout=120).stdout  # fmt: skip
    lines = [line.strip() for line in out.splitlines()]
    assert "tunepilot schema > campaign.schema.json" in lines
    assert "tunepilot data show my-campaign/campaign.yaml -n 3 --per-class 1" in lines
    assert any(line.startswith("tunepilot demo ") and "generated tickets" in line for line in lines)


def test_issue12_5_a_table_sent_to_a_pipe_keeps_its_text_column_and_whole_ids():
    """A pipe has no width; the findings table must not squeeze the sentence or cut an id."""
    code = textwrap.dedent("""
        from tunepilot.console import print_findings
        from tunepilot.verdict import Finding, Verdict
        sentence = "312 validation examples share conversation_id with training; split by it"
        print_findings([Finding("near-duplicates across splits (MinHash)", Verdict.FAIL,
                                sentence, "D2, D8", ["conversation-000123-abcdef-0042"])], "audit")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                         timeout=120).stdout  # fmt: skip
    assert "conversation-000123-abcdef-0042" in out
    assert "312 validation examples share conversation_id with training; split by it" in out


def test_issue12_5_an_input_error_is_never_cut_into_lines_at_a_narrow_width(tmp_path):
    """A path or fix copied from an error (or grepped from a log) stays whole at any width."""
    deep = tmp_path / ("folder-with-a-long-name-" * 3) / "broken.yml"
    deep.parent.mkdir(parents=True)
    deep.write_text("base_model: x\nlora_r: [16\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "tunepilot.cli", "init", str(tmp_path / "out"),
                           "--from-axolotl", str(deep)], capture_output=True, text=True,
                          env={**ENV, "COLUMNS": "40"}, timeout=120)  # fmt: skip
    assert done.returncode == 2
    where = next(line for line in done.stderr.splitlines() if "broken.yml" in line)
    assert f"{deep}:3: not valid YAML" in where, done.stderr


def test_issue12_5_progress_in_a_log_is_one_line_per_interval_with_rate_and_eta(capsys):
    from tunepilot.progress import Progress

    with Progress("training control-s0-1", 200, "updates", every_s=0.05) as bar:
        for done in range(1, 101):
            if done == 60:
                time.sleep(0.06)
            bar.advance(done, f"loss {1 / done:.4f}")
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert 3 <= len(lines) <= 4, lines  # started, the one interval that passed, stopped
    assert "started, 0/200 updates" in lines[0]
    middle = next(line for line in lines if "60/200 updates" in line)
    assert "updates/s" in middle and "ETA " in middle and "loss 0.0167" in middle
    assert "done, 100/200 updates" in lines[-1] and "elapsed 0:0" in lines[-1]


def test_issue12_5_pilot_json_prints_a_start_line_per_gate_on_stderr_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    from tunepilot.pilot.flow import run_pilot

    ws = Workspace.open(tiny_campaign(tmp_path, **{"model.lora.target_modules": ["q_proj"]}))
    assert run_pilot(ws, as_json=True) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["verdict"] == "FAIL"  # stdout is the one document
    for number, gate in ((1, "environment"), (4, "load")):
        assert f"pilot gate {number} {gate} ..." in err
    assert "pilot gate 4 load: FAIL in " in err
