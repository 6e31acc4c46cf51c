"""A Hugging Face dataset saved with `save_to_disk` (Arrow), read as a data source (D1).

`data.files.train: path/to/folder` reads a saved `Dataset`, or the `train` split of a saved
`DatasetDict`; `folder[name]` picks another split (e.g. `validation: hub_copy[test]`). Rows
keep `folder[split]:row` (from 1) as their source, so every finding points back at one row,
and the fingerprint the dataset was saved with is recorded with the data version
(`data/<version>/splits.json`, `sources`). `datasets` is imported
only when such a folder is met.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunepilot.campaign.checks import saved_dataset_folder
from tunepilot.errors import ProblemList


@dataclass
class SavedDataset:
    """Where a saved dataset is and which split of it to read."""

    folder: Path
    split: str | None

    def label(self, split: str | None) -> str:
        return f"{self.folder}[{split}]" if split else str(self.folder)


def saved_dataset(path: Path) -> SavedDataset | None:
    """The saved dataset `path` names (a `save_to_disk` folder, optionally `[split]`), if any."""
    found = saved_dataset_folder(Path(path))
    return SavedDataset(*found) if found else None


def read_saved_dataset(
    saved: SavedDataset, split_name: str | None, problems: ProblemList
) -> tuple[list[tuple[int, dict[str, Any]]], list[str], str, str | None]:
    """(rows numbered from 1, columns, source label, fingerprint); problems name the fix."""
    try:
        import datasets
    except ImportError:
        problems.add(str(saved.folder), "a saved Hugging Face dataset, and `datasets` is not "
                     "installed", "pip install datasets")  # fmt: skip
        return [], [], str(saved.folder), None
    try:
        loaded = datasets.load_from_disk(str(saved.folder))
    except (OSError, ValueError, FileNotFoundError) as exc:
        problems.add(str(saved.folder), f"not a readable saved dataset ({str(exc)[:160]})",
                     "write it again with `dataset.save_to_disk(folder)`")  # fmt: skip
        return [], [], str(saved.folder), None
    split = saved.split
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        split = split or (split_name if split_name in names else None)
        if split is None and len(names) == 1:
            split = names[0]
        if split not in names:
            wanted = f"split `{split}`" if split else "a split"
            problems.add(
                str(saved.folder),
                f"a DatasetDict with splits {', '.join(names)}; {wanted} is not one of them",
                f"name the split: `{saved.folder}[{names[0]}]`, or give each split under "
                "data.files (train: folder[train], validation: folder[validation])",
            )
            return [], [], str(saved.folder), None
        table = loaded[split]
    else:
        if split is not None and split != (table_split := str(loaded.split or "")):
            problems.add(str(saved.folder), f"a single Dataset (split `{table_split or 'none'}`),"
                         f" not a DatasetDict with a `{split}` split",
                         f"drop `[{split}]` from the path")  # fmt: skip
            return [], [], str(saved.folder), None
        table = loaded
    rows = [(i, row) for i, row in enumerate(table.to_list(), start=1)]
    state = (
        saved.folder / split / "state.json"
        if isinstance(loaded, datasets.DatasetDict)
        else (saved.folder / "state.json")
    )
    return rows, list(table.column_names), saved.label(split), _fingerprint(state)


def _fingerprint(state: Path) -> str | None:
    """The fingerprint `save_to_disk` wrote in state.json: the producer's identity of this
    exact table (a reload computes a different one, so it is read, not recomputed)."""
    try:
        value = json.loads(state.read_text(encoding="utf-8")).get("_fingerprint")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, str) else None
