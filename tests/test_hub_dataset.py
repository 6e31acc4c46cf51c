"""`data.dataset` (D1): a dataset read the Hub's way, through `datasets.load_dataset` and its
cache, with a pinned revision and a split; refused clearly under HF_HUB_OFFLINE=1 when it is
not cached; a local dataset folder reads the same way, and its fingerprint is recorded with
the data version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunepilot.data.workspace import Workspace
from tunepilot.demo.campaign import write_demo_campaign

FIELDS = {"data.fields.text": "text", "data.fields.label": "label", "data.fields.id": None,
          "data.fields.group": None, "data.fields.time": None, "data.split.policy": "stratified",
          "data.file": None, "data.cleaning": ["nfc", "strip", "drop_empty",
                                               "drop_exact_duplicates"]}  # fmt: skip


def _spam_folder(shared_data: Path, folder: Path, n: int = 160) -> Path:
    """A local dataset folder as `load_dataset` reads one: train.jsonl, test.jsonl."""
    lines = (shared_data / "sms_spam" / "SMSSpamCollection").read_text(encoding="utf-8")
    rows = [dict(zip(("label", "text"), line.split("\t", 1), strict=True))
            for line in lines.splitlines()[:n]]  # fmt: skip
    folder.mkdir(parents=True)
    for name, part in (("train", rows[: n - 40]), ("test", rows[n - 40:])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return folder


@pytest.mark.realdata
def test_d1_a_local_dataset_folder_loads_through_load_dataset_with_its_fingerprint(
    shared_data: Path, tmp_path: Path
):
    _spam_folder(shared_data, tmp_path / "c" / "sms-spam")
    path = write_demo_campaign(tmp_path / "c", tiny=True, n_conversations=30, overrides={
        **FIELDS, "data.dataset": {"name": "sms-spam", "split": "train"}})  # fmt: skip
    ws = Workspace.open(path)
    prepared = ws.prepare()
    assert sum(len(v) for v in prepared.splits.values()) <= 120
    assert set(prepared.label_names) == {"ham", "spam"}
    saved = json.loads((ws.root / "data" / prepared.version / "splits.json").read_text())
    source = saved["sources"]["all"]
    assert source["source"] == "sms-spam[train]" and source["fingerprint"]
    example = prepared.splits["train"][0]
    assert example.source.startswith("sms-spam[train]:")
    again = Workspace.open(path).prepare(write=False)
    assert again.version == prepared.version  # the same rows: the same data version
    head = write_demo_campaign(tmp_path / "h", tiny=True, n_conversations=30, overrides={
        **FIELDS, "data.dataset": {"name": "sms-spam-missing", "split": "train[:50%]"}})
    from tunepilot.errors import InputError

    with pytest.raises(InputError) as err:
        Workspace.open(head).prepare(write=False)
    assert err.value.problems[0].where == "data.dataset"


def test_d1_an_uncached_hub_dataset_under_hf_hub_offline_is_refused_with_the_fix(
    tmp_path: Path,
):
    path = write_demo_campaign(tmp_path / "c", tiny=True, n_conversations=30, overrides={
        **FIELDS, "data.dataset": {"name": "tunepilot-tests/never-cached",
                                   "revision": "0123456789abcdef0123456789abcdef01234567"}})
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets")}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "tunepilot.cli", "data", "audit", str(path)],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, said[-2000:]
    assert "data.dataset" in said and "HF_HUB_OFFLINE=1" in said
    assert "is not in the datasets cache" in said
    assert "Traceback" not in done.stderr


def test_d1_a_hub_dataset_without_a_revision_is_refused_by_validate(tmp_path: Path):
    path = write_demo_campaign(tmp_path / "c", tiny=True, n_conversations=30, overrides={
        **FIELDS, "data.dataset": {"name": "org/tickets"}})  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "tunepilot.cli", "validate", str(path)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "data.dataset.revision" in done.stderr
    both = write_demo_campaign(tmp_path / "d", tiny=True, n_conversations=30, overrides={
        "data.dataset": {"name": "org/tickets", "revision": "abc"}})  # data.file stays too
    done = subprocess.run([sys.executable, "-m", "tunepilot.cli", "validate", str(both)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "exactly one of" in done.stderr
