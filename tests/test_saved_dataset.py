"""D1: a Hugging Face dataset saved with `save_to_disk` is a data source beside the files; its
rows point back at `folder[split]:row` and its fingerprint is recorded with the data version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunepilot.campaign import validate_mapping
from tunepilot.data.prepare import prepare_data
from tunepilot.errors import InputError

datasets = pytest.importorskip("datasets")

WORDS = ["refund", "late", "broken", "address", "cancel", "charged", "lost", "wrong"]


def rows(n: int, offset: int = 0) -> list[dict]:
    return [
        {"uid": f"t{offset + i}", "text": f"ticket {offset + i} about a {WORDS[i % 8]} order",
         "label": "billing" if i % 2 else "shipping"}
        for i in range(n)
    ]  # fmt: skip


def campaign(data: dict):
    return validate_mapping({
        "name": "saved",
        "hypothesis": {"behaviour": "route tickets", "task": "classification"},
        "model": {"name_or_path": "minilm"},
        "data": {"fields": {"id": "uid", "label": "label"}, **data},
    })  # fmt: skip


@pytest.fixture
def saved_dict(tmp_path: Path):
    train, test = rows(40), rows(10, offset=100)
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(train), "test": datasets.Dataset.from_list(test)}
    )
    dd.save_to_disk(str(tmp_path / "tickets_hf"))
    return dd


def test_d1_datasetdict_folder_splits_load_with_row_sources_and_fingerprints(
    saved_dict, tmp_path: Path
) -> None:
    c = campaign({"files": {"train": "tickets_hf", "validation": "tickets_hf[test]"},
                  "split": {"policy": "files", "test": 0.0}})  # fmt: skip
    prepared = prepare_data(c, tmp_path)
    train, validation = prepared.splits["train"], prepared.splits["validation"]
    assert len(train) == 40 and len(validation) == 10
    first = next(ex for ex in train if ex.id == "t3")
    assert first.source == f"{tmp_path / 'tickets_hf'}[train]:4"
    assert next(ex for ex in validation if ex.id == "t100").source.endswith("tickets_hf[test]:1")
    recorded = json.loads((prepared.folder / "splits.json").read_text())["sources"]
    on_disk = {s: json.loads((tmp_path / "tickets_hf" / s / "state.json").read_text())
               for s in ("train", "test")}  # fmt: skip
    assert recorded["train"]["fingerprint"] == on_disk["train"]["_fingerprint"]
    assert recorded["validation"]["fingerprint"] == on_disk["test"]["_fingerprint"]
    assert recorded["validation"]["source"].endswith("tickets_hf[test]")


def test_d1_a_single_saved_dataset_is_one_file_split_by_policy(tmp_path: Path) -> None:
    datasets.Dataset.from_list(rows(30)).save_to_disk(str(tmp_path / "one"))
    prepared = prepare_data(campaign({"file": "one", "split": {"policy": "random"}}), tmp_path)
    assert sum(len(v) for v in prepared.splits.values()) == 30


def test_d1_an_absent_split_names_the_splits_there_are(saved_dict, tmp_path: Path) -> None:
    c = campaign({"files": {"train": "tickets_hf", "validation": "tickets_hf[validation]"}})
    with pytest.raises(InputError) as err:
        prepare_data(c, tmp_path)
    problem = err.value.problems[0]
    assert "splits train, test" in problem.found and "`validation`" in problem.found
    assert "[train]" in problem.fix


def test_d1_validate_accepts_saved_dataset_folders_and_still_names_absent_ones(
    saved_dict, tmp_path: Path
) -> None:
    from tunepilot.campaign.checks import check_campaign

    good = campaign({"files": {"train": "tickets_hf", "validation": "tickets_hf[test]"}})
    assert check_campaign(good, tmp_path) == []
    bad = campaign({"files": {"train": "tickets_hf", "validation": "elsewhere[test]"}})
    [problem] = check_campaign(bad, tmp_path)
    assert problem.where == "data.files.validation" and "elsewhere[test]" in problem.found
