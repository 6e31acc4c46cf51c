"""Image campaigns' data sources -> `Example`s: a folder per class, or a table of paths (D1).

An image example's `text` is its path relative to the campaign folder (posix), and
`context["image_sha256"]` the sha256 of the file's bytes: the data version therefore changes
when a picture changes, and stays the same when the campaign folder moves. A table (CSV, TSV,
JSONL, Parquet) goes through the text loader (ids, labels, groups and times read exactly as
for text) with `data.fields.image` as the path column, paths relative to the table's folder.

Files are hashed here, never decoded: an unreadable or oversized image is the audit's FAIL
(naming the file), and training refuses it with exit 2; a *missing* file, or a path that leads
out of both the table's folder and the campaign folder (`../..`, or an absolute path
elsewhere), is a load error naming the row: such a campaign cannot be copied whole, and a stray
`../` usually means the paths were written relative to another folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from tunepilot.campaign import DataSettings
from tunepilot.data.load import load_file
from tunepilot.errors import ProblemList
from tunepilot.tasks.example import Example
from tunepilot.tasks.image_files import file_hash

HASH_KEY = "image_sha256"


def load_images(
    path: Path, data: DataSettings, task: str, split_name: str | None, root: Path
) -> list[Example]:
    """Every example of one image source; raises InputError listing every problem."""
    path, root = Path(path), Path(root).resolve()
    title = f"cannot load the {split_name} images {path}" if split_name else f"cannot load {path}"
    if path.is_dir():
        return _class_folders(path, root, title)
    problems = ProblemList(str(path))
    if not data.fields.image:
        problems.add(
            "data.fields.image",
            f"{path} is a table, and no column is named as the image path",
            "set data.fields.image to the column holding each image's path (relative to the "
            "table), or point data.file at a folder with one sub-folder per class",
        )
    if not data.fields.label:
        problems.add("data.fields.label", "no label column", "set data.fields.label")
    problems.raise_if_any(title)
    assert data.fields.image is not None
    fields = data.fields.model_copy(update={"text": data.fields.image})
    rows = load_file(path, data.model_copy(update={"fields": fields}), task, split_name)
    out = []
    folder = Path(os.path.abspath(path.parent))
    campaign = Path(os.path.abspath(root))
    for ex in rows:
        named = Path(os.path.normpath(folder / ex.text))  # lexical: a symlinked folder is fine
        if not (named.is_relative_to(folder) or named.is_relative_to(campaign)):
            problems.add(
                ex.source,
                f"image path `{ex.text}` leads out of the table's folder {folder} and the "
                f"campaign folder (to {named})",
                "keep the images under either folder (a symlinked folder is fine) and give "
                "paths relative to the table, so the campaign can be copied whole",
            )
            continue
        file = named.resolve()
        if not file.is_file():
            found = (f"image `{ex.text}` is {_not_a_file(named)}" if named.is_symlink()
                     or named.exists() else f"image `{ex.text}` not found (looked at {file})")
            problems.add(ex.source, found,
                         "fix the path (relative to the table's folder) or remove the row")
            continue
        relative = Path(os.path.relpath(file, root)).as_posix()
        context = {**ex.context, HASH_KEY: file_hash(file)}
        out.append(Example(ex.id, relative, ex.source, ex.label, None, ex.group, ex.time, context))
    problems.raise_if_any(title)
    return out


def _class_folders(folder: Path, root: Path, title: str) -> list[Example]:
    """One sub-folder per class; every non-hidden file in it is an example (a stray file is
    reported by the audit as undecodable, never skipped in silence), and every entry that is
    not a file (a dangling link, a FIFO, a socket) is a load error naming it: nothing in a
    class folder is dropped without a word."""
    problems = ProblemList(str(folder))
    classes = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        problems.add(
            str(folder),
            "no class sub-folders",
            "put each class's images in a sub-folder named after the class",
        )
    problems.raise_if_any(title)
    out = []
    for class_dir in classes:
        entries = sorted(p for p in class_dir.rglob("*") if not p.name.startswith("."))
        files = [p for p in entries if p.is_file()]
        for entry in entries:  # every entry that is neither a folder nor a file it can read
            if not entry.is_dir() and not entry.is_file():
                problems.add(str(entry), f"{_not_a_file(entry)}: it cannot be read as an image",
                             "remove it, or replace it with the image file itself")  # fmt: skip
        if not files:
            problems.add(str(class_dir), "an empty class folder", "add images or remove it")
        for file in files:
            inside = file.relative_to(folder).as_posix()
            relative = Path(os.path.relpath(file.resolve(), root)).as_posix()
            out.append(
                Example(
                    id=inside,
                    text=relative,
                    source=str(file),
                    label=class_dir.name,
                    context={HASH_KEY: file_hash(file)},
                )
            )
    problems.raise_if_any(title)
    return out


def _not_a_file(path: Path) -> str:
    """What an entry is when it is not a regular file: a reader opening a FIFO would wait for
    ever, and a dangling link names a file that is not there."""
    import stat

    if path.is_symlink() and not path.exists():
        return f"a dangling symbolic link (to {os.readlink(path)}, which does not exist)"
    mode = path.stat().st_mode
    kinds = {stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISSOCK: "a socket",
             stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}  # fmt: skip
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")
