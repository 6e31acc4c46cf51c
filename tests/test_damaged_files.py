"""Damaged or hand-edited files are bad input: exit 2 with the file and the fix, never a
traceback (R1, R4, D1). Each case was a raw exception before: KeyError, JSONDecodeError,
AttributeError, RecursionError, a SetupFailure escaping `run`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_sweep import write_sweep_campaign
from tunepilot.campaign import DataSettings
from tunepilot.data.load import load_file
from tunepilot.errors import InputError
from tunepilot.experiments.jobs import distributed_settings_of
from tunepilot.train.checkpoint import load_weights
from tunepilot.train.manifest import verify_checkpoint, write_manifest


def step_folder(tmp_path: Path, state: str) -> Path:
    folder = tmp_path / "checkpoints" / "step-000002"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(state, encoding="utf-8")
    write_manifest(folder)  # the manifest vouches for the file: only its content is wrong
    return folder


def test_r4_manifest_entry_without_bytes_is_refused_naming_the_manifest(tmp_path: Path):
    folder = step_folder(tmp_path, json.dumps({"update": 2, "sampler": {}, "weights": "full"}))
    manifest = json.loads((folder / "MANIFEST.json").read_text(encoding="utf-8"))
    for entry in manifest["files"].values():
        del entry["bytes"]
    (folder / "MANIFEST.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(InputError) as info:
        verify_checkpoint(folder)
    (problem,) = info.value.problems
    assert problem.where == str(folder / "MANIFEST.json") and "KeyError" in problem.found


@pytest.mark.parametrize("state", ["{not json", "[1, 2]", json.dumps({"update": 2})])
def test_r1_invalid_state_json_is_refused_naming_the_file(tmp_path: Path, state: str):
    folder = step_folder(tmp_path, state)
    with pytest.raises(InputError) as info:
        load_weights(folder, model=None)  # refused before any weight is read
    (problem,) = info.value.problems
    assert problem.where == str(folder / "state.json") and "resume from another" in problem.fix


@pytest.mark.parametrize("text", ["training: [unclosed\n", "- a list\n", "training: 3\n"])
def test_r1_corrupt_config_resolved_yaml_on_resume_is_refused(tmp_path: Path, text: str):
    (tmp_path / "config.resolved.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as info:
        distributed_settings_of(tmp_path)
    assert info.value.problems[0].where == str(tmp_path / "config.resolved.yaml")
    # advice that works: a checkpoint folder holds no copy of it; the retry names the run
    fix = info.value.problems[0].fix
    assert "checkpoint folder" not in fix and f"--retry {tmp_path.name}" in fix


def test_d1_deeply_nested_json_line_names_its_line(tmp_path: Path):
    path = tmp_path / "data.jsonl"
    deep = "[" * 200_000 + "]" * 200_000
    path.write_text('{"text": "fine", "label": "a"}\n{"text": ' + deep + ', "label": "b"}\n',
                    encoding="utf-8")  # fmt: skip
    settings = DataSettings.model_validate({"file": "x", "fields": {"label": "label"}})
    with pytest.raises(InputError) as info:
        load_file(path, settings, "classification")
    assert any(p.where == f"{path}:2" and "nested too deeply" in p.found
               for p in info.value.problems)  # fmt: skip


def test_p1_lora_target_matching_nothing_at_run_is_bad_input_with_the_key(
    tmp_path: Path, tiny_bert_dir: Path
):
    from tunepilot.data.workspace import Workspace
    from tunepilot.experiments import flow
    from tunepilot.ledger import Ledger

    ws = Workspace.open(write_sweep_campaign(tmp_path / "c", tiny_bert_dir, n=30),
                        ["model.lora.target_modules=[no_such_module]"])  # fmt: skip
    with pytest.raises(InputError) as info:
        flow.run(ws, ["control"], "0", None, as_json=False)
    problem = info.value.problems[0]
    assert problem.where == "model.lora.target_modules"
    assert "query" in problem.fix and "as the sentence says" not in problem.fix  # a real fix
    with Ledger.open(ws.ledger_path) as ledger:  # the attempt keeps its line and reason (V3)
        (row,) = ledger.list_runs()
    assert row.status == "failed" and "no_such_module" in (row.reason or "")
