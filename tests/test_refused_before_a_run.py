"""Bad input found while a run starts is exit 2 naming the file (and line) and the fix, before a
run id is reserved: never an exit 3 recorded as a failed run, "not your campaign" (D1, S6, R4).

Each case was an unexpected exception before: a damaged `model.safetensors` header in the base
(a raw SafetensorError at `run` and `baseline`), a lone `\\ud800` escape in a JSONL text (a
UnicodeEncodeError at `data audit` and `run`), and a `data.max_length` beyond the model's
positions that `validate` refused but `run` accepted (a crash, or exit 0 when the long text sat
only in the sealed test split).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from test_sweep import write_sweep_campaign
from tunepilot.campaign import load_campaign
from tunepilot.campaign.checks import check_campaign
from tunepilot.data.load import load_file
from tunepilot.data.workspace import Workspace
from tunepilot.errors import InputError
from tunepilot.experiments import flow as run_flow
from tunepilot.ledger import Ledger


def runs_in(ws: Workspace) -> list[str]:
    if not ws.ledger_path.is_file():
        return []
    with Ledger.open(ws.ledger_path) as ledger:
        return [r.id for r in ledger.list_runs()]


def test_r4_a_damaged_base_safetensors_header_is_exit_2_at_run_and_baseline(
    tmp_path: Path, tiny_bert_dir: Path
) -> None:
    base = tmp_path / "base"
    shutil.copytree(tiny_bert_dir, base)
    weights = base / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:20] = b"garbage!!!!!"  # the JSON header no longer parses
    weights.write_bytes(bytes(data))
    ws = Workspace.open(write_sweep_campaign(tmp_path / "c", base, n=30))
    for command in (lambda: run_flow.run(ws, ["control"], "0", None, as_json=True),
                    lambda: run_flow.baseline(Workspace.open(ws.campaign_file), True)):
        with pytest.raises(InputError) as info:
            command()
        (problem,) = info.value.problems
        assert problem.where == str(weights) and "safetensors" in problem.found
        assert "re-download or restore model.safetensors" in problem.fix
    assert runs_in(ws) == []


def test_d1_a_lone_surrogate_escape_in_jsonl_names_the_line_at_audit_and_run(
    tmp_path: Path, tiny_bert_dir: Path
) -> None:
    path = write_sweep_campaign(tmp_path / "c", tiny_bert_dir, n=30)
    data = path.parent / "data.jsonl"
    lines = data.read_text(encoding="utf-8").splitlines()
    lines[3] = lines[3].replace('"text": "', '"text": "\\ud800 ')  # half of a UTF-16 pair
    lines[5] = lines[5].replace('"text": "', '"text": "\\ud83d\\ude00 ')  # a whole pair: fine
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ws = Workspace.open(path)
    for command in (lambda: ws.prepare(write=False, seal=False),  # data audit / show
                    lambda: run_flow.run(ws, ["control"], "0", None, as_json=True)):
        with pytest.raises(InputError) as info:
            command()
        (problem,) = info.value.problems
        assert problem.where == f"{data}:4", problem
        assert "`\\ud800` (column" in problem.found and "whole pair" in problem.fix
    assert runs_in(ws) == [] and not (ws.root / "data").exists()


def test_d1_an_escaped_backslash_before_u_is_text_not_a_surrogate(tmp_path: Path) -> None:
    from tunepilot.campaign import DataSettings

    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"text": "C:\\ud800 folder", "label": "a"}) + "\n")
    settings = DataSettings.model_validate({"file": "x", "fields": {"label": "label"}})
    (example,) = load_file(path, settings, "classification")
    assert example.text == "C:\\ud800 folder"


def test_s6_max_length_beyond_the_models_positions_is_refused_at_run_like_validate(
    tmp_path: Path, tiny_bert_dir: Path
) -> None:
    """Every text here is short, as when only the sealed test split holds a long one: training
    passed (exit 0) and the first long input would crash. `run` refuses as `validate` does,
    whichever split holds the long text."""
    path = write_sweep_campaign(tmp_path / "c", tiny_bert_dir, n=30)
    text = path.read_text(encoding="utf-8").replace("max_length: 32", "max_length: 1024")
    path.write_text(text, encoding="utf-8")
    validated = check_campaign(load_campaign(path), path.parent)
    ws = Workspace.open(path)
    with pytest.raises(InputError) as info:
        run_flow.run(ws, ["control"], "0", None, as_json=True)
    (problem,) = info.value.problems
    assert problem.where == "data.max_length" and "max_position_embeddings 512" in problem.found
    assert [p.found for p in validated] == [problem.found]  # one judgement, two commands
    assert runs_in(ws) == []
