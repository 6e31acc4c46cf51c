"""Campaign -> PreparedData: load every file, clean, split with the sealed test, version (D1, D8,
H4), and record what was used under `data/<version>/splits.json`.

Why here and not in each command: the audit, `data show`, the pilot and training must all see
the same examples, so there is exactly one path from the campaign to the splits. The first
prepare that has a test split writes `data/test_seal.json`; every later prepare reads it and
keeps those ids as the test split, whatever the seed or the file order (H4).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tunepilot.campaign import CLASSIFICATION_TASKS, Campaign, stable_hash
from tunepilot.data.clean import clean
from tunepilot.data.generic import generic_texts
from tunepilot.data.images.load import load_images
from tunepilot.data.load import load_file
from tunepilot.data.prepared import PreparedData
from tunepilot.data.split import SEAL_FILE, make_splits
from tunepilot.data.version import data_version
from tunepilot.errors import MAX_PROBLEMS, InputError, Problem, write_json_atomic
from tunepilot.tasks.example import SPLITS, Example, Splits


def prepare_data(
    campaign: Campaign, root: Path, write: bool = True, seal: bool = True
) -> PreparedData:
    """Load, clean, split and version the campaign's data; write the split ids when `write`.

    An existing seal always fixes the test split (H4). A new one is created only when `seal`:
    the commands that only look at the data (audit, show) do not seal, so exploring
    `data.split.policy=random` on the command line cannot fix a leaky test split for good.
    """
    root = Path(root)
    data = campaign.data
    task = campaign.hypothesis.task
    loaded, sources = _load_all(campaign, root)
    order = list(loaded)
    # Clean the whole file set at once, in train, validation, test order, so that
    # drop_exact_duplicates keeps the training copy of a duplicate (see clean.py).
    cleaned, counts = clean([ex for name in order for ex in loaded[name]], data.cleaning)
    if not cleaned:
        raise InputError(
            [
                Problem(
                    "data.cleaning",
                    "no example is left after cleaning",
                    "check the text column (`data.fields.text`) and the cleaning rules",
                )
            ],
            title="no data",
        )
    source: list[Example] | dict[str, list[Example]] = cleaned
    if data.files is not None:
        home = {ex.id: name for name in order for ex in loaded[name]}
        source = {name: [] for name in order}
        for ex in cleaned:
            source[home[ex.id]].append(ex)
        _refuse_emptied_files(loaded, source, campaign, root)
    sealed = read_seal(root)
    splits = make_splits(source, data.split, data.fields, sealed["ids"] if sealed else None)
    label_names = _label_names(campaign, splits)
    encoding = encoding_identity(campaign, label_names)
    version = data_version(splits, data.cleaning, data.split, encoding)
    policy = data.split.model_dump(mode="json")
    folder = None
    if write:
        folder = root / "data" / version
        write_json_atomic(
            folder / "splits.json",
            {
                "version": version,
                "policy": policy,
                "counts": {name: len(exs) for name, exs in splits.items()},
                "ids": {name: [ex.id for ex in exs] for name, exs in splits.items()},
                "cleaning": [asdict(c) for c in counts],
                "label_names": label_names,
                "encoding": encoding,
                "task": task,
                "sources": sources,
            },
        )
        if sealed is None and seal and splits["test"]:
            sealed = new_seal([ex.id for ex in splits["test"]])
            write_json_atomic(root / SEAL_FILE, sealed)
    return PreparedData(
        splits=splits,
        version=version,
        label_names=label_names,
        cleaning=counts,
        split_policy=policy,
        folder=folder,
        test_seal=sealed,
        # how many groups say a text is counted before drop_exact_duplicates keeps one copy
        generic=generic_texts({"all": [ex for exs in loaded.values() for ex in exs]},
                              data.fields.group),  # fmt: skip
    )


def data_paths(campaign: Campaign, root: Path) -> dict[str, Path]:
    """{split or "all": path}; relative paths start at the campaign folder."""
    data = campaign.data
    given = dict(data.files) if data.files is not None else {"all": data.file or ""}
    ordered = {name: given[name] for name in (*SPLITS, "all") if name in given}
    out = {}
    for name, text in ordered.items():
        path = Path(text).expanduser()
        out[name] = path if path.is_absolute() else Path(root) / path
    return out


def encoding_identity(campaign: Campaign, label_names: list[str]) -> dict[str, Any]:
    """What the data version includes about encoding (D1). The label order is in it because
    it fixes which class id each name gets (D6)."""
    m, d, task = campaign.model, campaign.data, campaign.hypothesis.task
    identity = {
        "task": task,
        "model": m.name_or_path,
        "revision": m.revision,
        "max_length": d.max_length,
        "template": d.template if task not in CLASSIFICATION_TASKS else None,
        "mask_prompt": d.mask_prompt,
        "label_names": label_names,
    }
    if d.chat is not None:
        identity["chat"] = d.chat.model_dump(mode="json")
    if task == "image_classification":  # transforms are versioned as cleaning rules are
        identity["images"] = d.images.model_dump(
            mode="json", include={"augment", "exif_transpose", "max_pixels"}
        )
    return identity


def read_seal(root: Path) -> dict[str, Any] | None:
    """The sealed test ids, checked against their own hash so an edited seal is refused."""
    path = Path(root) / SEAL_FILE
    if not path.is_file():
        return None
    fix = "restore the file from a backup, or delete it deliberately to seal a new test"
    try:
        seal = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(
            [Problem(str(path), f"not readable JSON ({exc})", fix)], title="broken test seal"
        ) from None
    ids = seal.get("ids") if isinstance(seal, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise InputError(
            [Problem(f"{path} ids", "no list of test ids", fix)], title="broken test seal"
        )
    if seal.get("hash") != seal_hash(ids):
        raise InputError(
            [
                Problem(
                    f"{path} hash", "the ids do not match the seal's hash (edited by hand?)", fix
                )
            ],
            title="broken test seal",
        )
    return seal


def seal_hash(ids: list[str]) -> str:
    """The seal fixes *which* examples are the test; the data version covers their content."""
    return stable_hash(sorted(ids))


def new_seal(ids: list[str]) -> dict[str, Any]:
    return {
        "ids": list(ids),
        "hash": seal_hash(list(ids)),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _load_all(
    campaign: Campaign, root: Path
) -> tuple[dict[str, list[Example]], dict[str, dict[str, Any]]]:
    """Every file loaded, or one InputError with the problems of all files together; and per
    split what each source was (a saved dataset's split and fingerprint, D1)."""
    data, task = campaign.data, campaign.hypothesis.task
    problems: list[Problem] = []
    loaded: dict[str, list[Example]] = {}
    sources: dict[str, dict[str, Any]] = {}
    if data.dataset is not None:
        from tunepilot.data.load import load_dataset_source

        sources["all"] = {}
        try:
            loaded["all"] = load_dataset_source(data.dataset, root, data, task, sources["all"])
        except InputError as exc:
            problems.extend(exc.problems)
    for name, path in data_paths(campaign, root).items() if data.dataset is None else ():
        split = None if name == "all" else name
        sources[name] = {"source": str(path)}
        try:
            if task == "image_classification":
                loaded[name] = load_images(path, data, task, split, root)
            else:
                loaded[name] = load_file(path, data, task, split, record=sources[name])
        except InputError as exc:
            problems.extend(exc.problems)
    seen: dict[str, Example] = {}
    repeats = 0
    for name in loaded:
        for ex in loaded[name]:
            first = seen.setdefault(ex.id, ex)
            if first is not ex:
                repeats += 1
                if repeats > MAX_PROBLEMS:
                    continue
                problems.append(
                    Problem(
                        ex.source,
                        f"id `{ex.id}` is also used at {first.source}",
                        "ids must be unique across the train/validation/test files",
                    )
                )
    if repeats > MAX_PROBLEMS:
        problems.append(
            Problem(
                "data.files",
                f"and {repeats - MAX_PROBLEMS} more repeated id(s)",
                "fix the ones above first",
            )
        )
    if problems:
        raise InputError(problems, title="cannot load the data")
    return loaded, sources


def _refuse_emptied_files(
    loaded: dict[str, list[Example]],
    kept: dict[str, list[Example]],
    campaign: Campaign,
    root: Path,
) -> None:
    """A split file whose every row cleaning removed: say which rule took them and why,
    instead of a bare "validation empty" (or a test split that silently disappears)."""
    from tunepilot.data.clean import duplicate_key

    paths = data_paths(campaign, root)
    problems: list[Problem] = []
    for name, rows in loaded.items():
        if name == "train" or not rows or kept.get(name):
            continue
        earlier = {duplicate_key(ex): ex for split in SPLITS if split != name
                   for ex in loaded.get(split, [])
                   if SPLITS.index(split) < SPLITS.index(name)}  # fmt: skip
        copies = [(ex, earlier[duplicate_key(ex)]) for ex in rows if duplicate_key(ex) in earlier]
        if copies and "drop_exact_duplicates" in campaign.data.cleaning:
            shown = ", ".join(f"{a.source} = {b.source}" for a, b in copies[:3])
            why = (f"all {len(rows)} rows of {paths[name].name} were removed by data.cleaning: "
                   f"{len(copies)} repeat a row of an earlier split after normalisation and "
                   f"drop_exact_duplicates keeps the earlier copy (e.g. {shown}); the file "
                   "looks like a copy of the training data")  # fmt: skip
            fix = (f"give a {name} file with other examples, or leave data.files.{name} out "
                   "and it is carved from train by data.split")  # fmt: skip
        else:
            why = (f"all {len(rows)} rows of {paths[name].name} were removed by data.cleaning "
                   f"({', '.join(map(str, campaign.data.cleaning))})")  # fmt: skip
            fix = "check the text column (data.fields.text) and the cleaning rules"
        problems.append(Problem(f"data.files.{name}", why, fix))
    if problems:
        raise InputError(problems, title="a split file is empty after cleaning")


def _label_names(campaign: Campaign, splits: Splits) -> list[str]:
    """Declared labels in their order, else the sorted training labels (classification only).
    Evaluation labels unseen in training are the audit's FAIL to report, not an error here."""
    if not campaign.hypothesis.is_classification:
        return []
    if campaign.data.labels:
        return list(campaign.data.labels)
    return sorted({ex.label for ex in splits["train"] if ex.label is not None})
