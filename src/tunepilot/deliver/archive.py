"""`tunepilot archive CAMPAIGN [DEST]`: the whole campaign folder in one verified file (L4, R3).

The notebook keeps the decisions; the backups keep the files. An archive is a tar file (gzip
when DEST ends in .tar.gz or .tgz) holding, under `campaign/`, every plain file of the folder:
the campaign file, data versions and the sealed test's seal, runs with their checkpoints,
pilots, exports, the dossier, and a snapshot of the ledger; then `ARCHIVE-MANIFEST.json`, the
sha256 and size of every file, what was left out and why, and what the ledger held.

The ledger may be written while the archive is made (a run training, `note` typed in another
shell). Copying `tunepilot.db` with its `-wal` file byte by byte could catch a half-applied
checkpoint of the log; SQLite's backup API (`sqlite3.Connection.backup`) copies it as one
read transaction instead: a consistent state, taken without stopping any writer. It is taken
first, so every file it refers to was written before it (a newer checkpoint or curve line in
the folder is harmless: a resume takes the newest checkpoint that verifies).

Left out, and named in the manifest: temporary files of a write in progress (`.tmp-*`
folders, `.NAME.PID.tmp`), the ledger's own `-wal`/`-shm` files (the snapshot replaces them),
symbolic links and anything that is not a plain file, and files that vanished while being read
(a checkpoint deleted by keep-last). Each file is read once, hashed as it is written into the
archive, and recorded with the bytes actually archived. The archive is written under a
temporary name and renamed into place; an existing file is never overwritten.

`restore.py` reads it back: every byte against the manifest before the campaign is usable.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tunepilot.errors import input_error, writing

FORMAT = "tunepilot-archive/1"
MANIFEST = "ARCHIVE-MANIFEST.json"
PREFIX = "campaign"  # every campaign file lies under campaign/ in the archive
SUFFIXES = (".tar", ".tar.gz", ".tgz")
LEDGER_FILES = ("tunepilot.db", "tunepilot.db-wal", "tunepilot.db-shm", "tunepilot.db-journal")
_CHUNK = 1 << 20


def campaign_root(campaign: Path) -> Path:
    """The campaign folder of a campaign file, or a folder holding a campaign file or a
    ledger."""
    path = Path(campaign).expanduser()
    root = path if path.is_dir() else path.parent
    if not path.exists() or not (path.is_file() or (root / "tunepilot.db").is_file()
                                 or any(root.glob("*.yaml"))):  # fmt: skip
        raise input_error(str(campaign), "no campaign file or campaign folder there",
                          "give the campaign file (campaign.yaml) or its folder")  # fmt: skip
    return root.resolve()


def archive_destination(root: Path, dest: Path | None) -> Path:
    """Where the archive goes: DEST as given, a new name inside DEST when it is a folder,
    `<folder>-<UTC time>.tar` beside the campaign folder by default. Never inside the folder
    it archives, never over an existing file."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    name = f"{root.name}-{stamp}.tar"
    target = root.parent / name if dest is None else Path(dest).expanduser()
    if target.is_dir():
        target = target / name
    target = target.resolve()
    if not target.name.endswith(SUFFIXES):
        raise input_error(str(dest), "not an archive name",
                          f"end it in {', '.join(SUFFIXES)} (gzip for the last two)")  # fmt: skip
    if target.is_relative_to(root):
        raise input_error(str(dest), "inside the campaign folder it archives",
                          "write the archive outside the folder (the default: beside it)")
    if target.exists():
        raise input_error(str(target), "already exists; archives are never overwritten",
                          "choose another DEST, or move the old archive away")  # fmt: skip
    if not target.parent.is_dir():
        raise input_error(str(target.parent), "no such folder", "create it, or choose DEST")
    return target


def snapshot_ledger(db: Path, into: Path) -> dict[str, Any]:
    """A consistent copy of the ledger taken with SQLite's backup API while writers go on,
    checked with `PRAGMA integrity_check`; returns what it holds."""
    source = sqlite3.connect(db, timeout=30)
    target = sqlite3.connect(into)
    try:
        source.backup(target)  # one step (pages=-1): one read transaction, one state
        target.execute("PRAGMA journal_mode=DELETE")  # a single self-contained file
        check = target.execute("PRAGMA integrity_check").fetchone()[0]
        if check != "ok":
            raise input_error(str(db), f"the ledger fails SQLite's integrity check ({check})",
                              "restore it from an earlier archive or copy")  # fmt: skip
        version = target.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        statuses = dict(target.execute(
            "SELECT s.status, count(*) FROM runs r JOIN run_status s ON s.id = (SELECT max(id) "
            "FROM run_status WHERE run_id = r.id) GROUP BY s.status").fetchall())  # fmt: skip
        running = [r[0] for r in target.execute(
            "SELECT r.id FROM runs r JOIN run_status s ON s.id = (SELECT max(id) FROM run_status "
            "WHERE run_id = r.id) WHERE s.status = 'running' ORDER BY r.rowid")]  # fmt: skip
        tables = [r[0] for r in target.execute("SELECT name FROM sqlite_master WHERE type = "
                                               "'table'")]  # fmt: skip
        notes = target.execute("SELECT count(*) FROM notebook").fetchone()[0]
        decisions = (target.execute("SELECT count(*) FROM decisions").fetchone()[0]
                     if "decisions" in tables else 0)  # fmt: skip
    finally:
        target.close()
        source.close()
    return {"schema_version": version, "runs": statuses, "running": running, "notes": notes,
            "decisions": decisions, "method": "sqlite3 backup API, integrity_check ok"}  # fmt: skip


def _left_out(rel: Path) -> str | None:
    """Why a path of the campaign folder is not archived, or None."""
    if rel.as_posix() in LEDGER_FILES:
        return "the ledger's own file: its snapshot is archived instead"
    for part in rel.parts:
        if part.startswith(".tmp-") or (part.startswith(".") and part.endswith(".tmp")):
            return "a temporary file of a write in progress"
    return None


def _walk(root: Path) -> Iterator[tuple[Path, str | None]]:
    """Every path under `root`, sorted, with why it is left out (None: archive it)."""
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        here = Path(folder)
        for d in list(dirs):
            rel = here.relative_to(root) / d
            why = "a symbolic link (the archive holds plain files)" if (here / d).is_symlink() \
                else _left_out(rel)  # fmt: skip
            if why:
                dirs.remove(d)
                yield rel, why
        for name in sorted(files):
            rel = here.relative_to(root) / name
            try:
                mode = os.lstat(here / name).st_mode
            except FileNotFoundError:
                yield rel, "vanished while archiving"
                continue
            if stat.S_ISLNK(mode):
                yield rel, "a symbolic link (the archive holds plain files)"
            elif not stat.S_ISREG(mode):
                yield rel, "not a plain file"
            else:
                yield rel, _left_out(rel)


class _Hashing(io.RawIOBase):
    """Reads exactly `size` bytes of `handle`, hashing them: what the manifest records is
    what the archive holds, even when the file grows while it is read."""

    def __init__(self, handle: Any, size: int) -> None:
        self.handle, self.left, self.digest = handle, size, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.handle.read(n)
        if n and not data:
            raise OSError("the file shrank while it was archived; archive again")
        self.left -= len(data)
        self.digest.update(data)
        return data


def _add_file(tar: tarfile.TarFile, path: Path, name: str) -> dict[str, Any]:
    with path.open("rb") as handle:
        st = os.fstat(handle.fileno())
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = st.st_size, int(st.st_mtime), st.st_mode & 0o755 | 0o644
        reader = _Hashing(handle, st.st_size)
        tar.addfile(info, reader)
    return {"sha256": reader.digest.hexdigest(), "bytes": st.st_size}


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(datetime.now(UTC).timestamp()), 0o644
    tar.addfile(info, io.BytesIO(data))


def write_archive(root: Path, target: Path) -> dict[str, Any]:
    """Archive the campaign folder `root` into `target` (see the module docstring); returns
    the manifest, with `manifest_sha256`, the archive's pin, added."""
    from tunepilot import __version__

    gz = target.name.endswith((".tar.gz", ".tgz"))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    manifest: dict[str, Any] = {"format": FORMAT, "folder": root.name, "tunepilot_version":
                                __version__, "created_at": datetime.now(UTC).isoformat(
                                timespec="seconds"), "files": {}, "left_out": []}  # fmt: skip
    try:
        with writing(tmp, None, "`tunepilot archive` again"), tempfile.TemporaryDirectory(
                dir=target.parent, prefix=".archive-") as scratch:  # fmt: skip
            with tarfile.open(tmp, "w:gz" if gz else "w", format=tarfile.PAX_FORMAT) as tar:
                if (root / "tunepilot.db").is_file():  # first: everything else is newer
                    snap = Path(scratch) / "tunepilot.db"
                    manifest["ledger"] = snapshot_ledger(root / "tunepilot.db", snap)
                    manifest["files"]["tunepilot.db"] = _add_file(tar, snap,
                                                                  f"{PREFIX}/tunepilot.db")
                for rel, why in _walk(root):
                    if why is None:
                        try:
                            manifest["files"][rel.as_posix()] = _add_file(
                                tar, root / rel, f"{PREFIX}/{rel.as_posix()}")
                            continue
                        except FileNotFoundError:
                            why = "vanished while archiving"
                    if rel.as_posix() != "tunepilot.db":
                        manifest["left_out"].append({"path": rel.as_posix(), "why": why})
                text = json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False)
                _add_bytes(tar, MANIFEST, text.encode("utf-8"))
            with tmp.open("rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    manifest["manifest_sha256"] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return manifest


def archive_command(campaign: Path, dest: Path | None, as_json: bool) -> int:
    """`tunepilot archive`: write the archive, note it in the notebook, print its pin."""
    from tunepilot.console import console, print_json

    root = campaign_root(campaign)
    target = archive_destination(root, dest)
    manifest = write_archive(root, target)
    pin, files = manifest["manifest_sha256"], manifest["files"]
    size = sum(int(f["bytes"]) for f in files.values())
    if (root / "tunepilot.db").is_file():
        from tunepilot.ledger import Ledger

        with Ledger.open(root) as ledger:
            ledger.add_note(f"archived to {target.name}: {len(files)} files, {size:,} bytes, "
                            f"manifest sha256 {pin}")  # fmt: skip
    summary = {"archive": str(target), "files": len(files), "bytes": size,
               "left_out": manifest["left_out"], "ledger": manifest.get("ledger"),
               "manifest_sha256": pin}  # fmt: skip
    if as_json:
        print_json(summary)
        return 0
    running = (manifest.get("ledger") or {}).get("running") or []
    console.print(f"archived {root.name} to [bold]{target}[/] ({len(files)} files, "
                  f"{size / 2**20:.1f} MiB; ledger snapshot by SQLite's backup API"
                  + (f", {len(running)} run(s) running at the time: {', '.join(running)}"
                     if running else "") + ")", highlight=False, soft_wrap=True)  # fmt: skip
    for item in manifest["left_out"][:10]:
        console.print(f"  left out {item['path']}: {item['why']}", highlight=False, markup=False)
    console.print(f"restore and verify it with `tunepilot restore {target} DIR --expect {pin}`",
                  highlight=False, soft_wrap=True, markup=False)  # fmt: skip
    return 0
