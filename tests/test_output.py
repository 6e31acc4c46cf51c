"""Output people expect: help examples one a line, whole columns in logs and pipes, progress
with rate and ETA on stderr only, a start line per pilot gate."""

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


def test_output_top_level_help_keeps_one_example_per_line():
    out = subprocess.run([sys.executable, "-m", "tunepilot.cli", "--help"], capture_output=True,
                         text=True, env=ENV, timeout=120).stdout  # fmt: skip
    lines = [line.strip() for line in out.splitlines()]
    assert "tunepilot schema > campaign.schema.json" in lines
    assert "tunepilot data show my-campaign/campaign.yaml -n 3 --per-class 1" in lines
    assert any(line.startswith("tunepilot demo ") and "generated tickets" in line for line in lines)


def test_output_a_table_sent_to_a_pipe_keeps_its_text_column_and_whole_ids():
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


def test_output_an_input_error_is_never_cut_into_lines_at_a_narrow_width(tmp_path):
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


def test_output_progress_in_a_log_is_one_line_per_interval_with_rate_and_eta(capsys):
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


def test_output_pilot_json_prints_a_start_line_per_gate_on_stderr_only(
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


def test_output_an_inner_progress_in_a_log_speaks_only_when_it_lasts(capsys):
    """An evaluation inside training: a quick one adds no line, a long one prints its own
    per-interval lines (rate, ETA) and its end, so a log is never silent for minutes."""
    from tunepilot.progress import Progress

    with Progress("training r1", 10, "updates", every_s=0.05) as outer:
        outer.advance(1)
        with Progress("validation of r1", 100, "examples", every_s=0.05) as quick:
            quick.advance(100)
        with Progress("validation of r1", 100, "examples", every_s=0.05) as slow:
            slow.advance(10)
            time.sleep(0.06)
            slow.advance(40)
            slow.advance(100)
        outer.advance(2)
    out, err = capsys.readouterr()
    assert out == ""
    inner = [line for line in err.splitlines() if "validation of r1" in line]
    assert len(inner) == 2, err  # the slow one: one interval line and its end
    assert "40/100 examples" in inner[0] and "ETA " in inner[0] and "examples/s" in inner[0]
    assert "done, 100/100 examples" in inner[1]
    assert "started" not in "".join(inner)


def test_output_a_stepless_phase_in_a_log_says_it_is_still_running(capsys):
    """A pilot gate or the audit's checks count nothing for minutes: a heartbeat line per
    interval names it with its elapsed time; an inner progress that speaks silences it."""
    from tunepilot.progress import Progress

    with Progress("pilot p-1", 13, "gates", every_s=0.05, heartbeat=True) as bar:
        bar.advance(8, "gate 9 overfit")
        time.sleep(0.2)
    with Progress("data audit", None, "checks", every_s=0.05, heartbeat=True):
        time.sleep(0.2)
    lines = capsys.readouterr().err.splitlines()
    beats = [line for line in lines if "pilot p-1: running" in line]
    assert 2 <= len(beats) <= 5, lines
    assert "8/13 gates" in beats[0] and "ETA " in beats[0] and "gate 9 overfit" in beats[0]
    audit = [line for line in lines if "data audit: running" in line]
    assert audit and "elapsed 0:00" in audit[0] and "checks" not in audit[0]


def test_output_an_inner_progress_on_a_terminal_is_a_second_row_of_the_same_bar():
    """Rich allows one live display: the inner progress adds a row to the outer bar and
    removes it when done, instead of failing with a LiveError."""
    from tunepilot.progress import Progress

    outer = Progress("training r1", 10, "updates")
    outer.mode = "bar"  # as on a terminal
    with outer:
        inner = Progress("validation of r1", 5, "examples")
        inner.mode = "bar"
        with inner:
            assert inner._bar is outer._bar and len(outer._bar.tasks) == 2
            inner.advance(5)
        assert len(outer._bar.tasks) == 1
