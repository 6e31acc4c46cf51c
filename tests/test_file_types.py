"""One file-type rule for checkpoints and bundles (R4): a file is judged by its bytes, never only
by its name, and nothing is deserialised to judge it.

Before, a text pickle saved as `notes.json` inside a checkpoint (listed in its MANIFEST) was
accepted, while `verify` refused the very same file in a bundle.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from tunepilot.deliver.bundle_check import check_files
from tunepilot.errors import InputError
from tunepilot.train.manifest import verify_checkpoint, write_manifest


class Payload:
    """Stands for what an attacker pickles; never unpickled here."""


PICKLES = {
    "protocol 0 (text)": pickle.dumps({"note": Payload.__name__}, protocol=0),
    "protocol 4": pickle.dumps({"note": "x"}, protocol=4),
}


def _folder(tmp_path: Path, name: str, files: dict[str, bytes], fmt: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for file, data in files.items():
        (folder / file).write_bytes(data)
    write_manifest(folder, fmt)  # the MANIFEST vouches for every file: only the bytes are wrong
    return folder


@pytest.mark.parametrize("kind", list(PICKLES))
def test_r4_pickle_bytes_named_notes_json_are_refused_in_a_checkpoint_and_a_bundle_alike(
    tmp_path: Path, kind: str
) -> None:
    files = {"state.json": json.dumps({"update": 2}).encode(), "notes.json": PICKLES[kind]}
    checkpoint = _folder(tmp_path, "step-000002", files, "tunepilot-checkpoint/1")
    bundle = _folder(tmp_path, "bundle", files, "tunepilot-bundle/1")
    with pytest.raises(InputError) as info:
        verify_checkpoint(checkpoint)
    (problem,) = info.value.problems
    assert problem.where == str(checkpoint / "notes.json")
    (finding,) = [f for f in check_files(bundle) if f["verdict"] == "FAIL"]
    assert finding["examples"] == ["notes.json"]
    assert problem.found in finding["sentence"]  # the same reason in both places
    assert "pickle bytes" in problem.found


def test_r4_a_safetensors_file_whose_tensors_lie_outside_it_is_refused_in_both(
    tmp_path: Path,
) -> None:
    """A header that parses but points past the end of the file (a truncated copy whose
    MANIFEST was rewritten): refused by its shape, before safetensors reads it."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    short = len(header).to_bytes(8, "little") + header + b"\0" * 8  # 8 of the 16 bytes
    files = {"state.json": b"{}", "adapter_model.safetensors": short}
    checkpoint = _folder(tmp_path, "step-000002", files, "tunepilot-checkpoint/1")
    bundle = _folder(tmp_path, "bundle", files, "tunepilot-bundle/1")
    with pytest.raises(InputError) as info:
        verify_checkpoint(checkpoint)
    assert "tensor `w` lies outside the file's bytes" in info.value.problems[0].found
    assert any("lies outside" in f["sentence"] for f in check_files(bundle))


def test_r4_plain_json_and_text_still_pass_both_checks(tmp_path: Path) -> None:
    files = {"state.json": json.dumps({"update": 2, "lr": [1e-4]}).encode(),
             "README.md": b"# notes (with a stop.)\n", "log.txt": b"(1, 2).\n"}  # fmt: skip
    verify_checkpoint(_folder(tmp_path, "step-000002", files, "tunepilot-checkpoint/1"))
    bundle = _folder(tmp_path, "bundle", files, "tunepilot-bundle/1")
    assert [f["verdict"] for f in check_files(bundle)] == ["PASS"]
