"""`data.dataset`: a dataset read the Hub's way (D1), through `datasets.load_dataset`.

`name` is a Hub dataset id at a pinned `revision` (the repository's commit), or a local
dataset folder (relative to the campaign) that `load_dataset` reads the same way: data files
named by split (`train.jsonl`, `data/train-*.parquet`) or a dataset script-less repository
clone. The files come through the `datasets` cache (`HF_HOME`, `HF_DATASETS_CACHE`):
downloaded once, then read from the cache; under `HF_HUB_OFFLINE=1` a dataset that is not
cached is refused with what to do, never waited on. `split` is a `datasets` split expression
(`train`, `train[:90%]`); `data.split.policy` then splits those rows into train, validation
and test like any file. Rows keep `name@revision[split]:row` as their source; the dataset's
fingerprint (the `datasets` cache's identity of this table) is recorded with the data version
in `data/<version>/splits.json`. `datasets` is imported only here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tunepilot.campaign.schema import DatasetSource
from tunepilot.errors import ProblemList, input_error


def offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))  # fmt: skip


def source_label(spec: DatasetSource) -> str:
    at = f"@{spec.revision}" if spec.revision else ""
    config = f"/{spec.config}" if spec.config else ""
    return f"{spec.name}{config}{at}[{spec.split}]"


def read_dataset_source(
    spec: DatasetSource, root: Path, problems: ProblemList
) -> tuple[list[tuple[int, dict[str, Any]]], list[str], str, str | None]:
    """(rows numbered from 1, columns, source label, fingerprint); problems name the fix."""
    label = source_label(spec)
    try:
        import datasets
    except ImportError:
        problems.add("data.dataset", "`datasets` is not installed", "pip install datasets")
        return [], [], label, None
    datasets.disable_progress_bars()  # its per-split bars would interleave with ours
    local = (root / spec.name).expanduser()
    target = str(local) if local.is_dir() else spec.name
    try:
        loaded = datasets.load_dataset(target, spec.config, revision=spec.revision,
                                       split=spec.split)  # fmt: skip
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as exc:
        said = " ".join(str(exc).split())[:300]
        if offline() and not local.is_dir():
            fix = (f"HF_HUB_OFFLINE=1 and `{spec.name}` is not in the datasets cache: run once "
                   "with the network (unset HF_HUB_OFFLINE) to cache it, or point data.dataset."
                   "name at a local copy")  # fmt: skip
        else:
            fix = ("check data.dataset.name, .config, .revision and .split (a Hub id, or a "
                   "folder relative to the campaign)")  # fmt: skip
        problems.add("data.dataset", f"`{label}` cannot be loaded ({said})", fix)
        return [], [], label, None
    if isinstance(loaded, datasets.DatasetDict):  # only when split is None, which it never is
        raise input_error("data.dataset.split", "several splits", "name one split")
    rows = [(i, row) for i, row in enumerate(loaded.to_list(), start=1)]
    return rows, list(loaded.column_names), label, getattr(loaded, "_fingerprint", None)
