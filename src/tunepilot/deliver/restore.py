"""`tunepilot restore ARCHIVE DIR`: a campaign folder back from its archive, verified (L4, R4).

Nothing is usable before everything is checked. The archive's last member must be its
manifest (`archive.py`); every other member must be a plain file under `campaign/` that the
manifest lists, with no absolute path, `..` or link, and each is written into a temporary
folder beside DIR while its sha256 and size are compared with the manifest. A missing, extra,
changed or truncated file refuses the whole restore (exit 2, naming it) and leaves nothing
behind; `--expect SHA` also pins the manifest itself, as printed by `archive`. Then the ledger
must pass SQLite's integrity check and open; only then is the folder renamed to DIR.

A run that was training when the archive was made is not training in the restored folder: it
gets a new status row, `interrupted`, saying so and how to resume it (its last checkpoint came
with the archive). The restore itself is written in the notebook. Nothing recorded is changed.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import sqlite3
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Any

from tunepilot.deliver.archive import FORMAT, MANIFEST, PREFIX
from tunepilot.errors import InputError, Problem, input_error, writing

MAX_MEMBERS = 1_000_000
MAX_MANIFEST_BYTES = 256 * 2**20
_CHUNK = 1 << 20


def _damaged(archive: Path, found: str, title: str = "archive refused") -> InputError:
    return input_error(str(archive), found, "use another copy of the archive (or make a new one "
                       "from the campaign folder); nothing was restored", title=title)  # fmt: skip


def read_manifest(tar: tarfile.TarFile, archive: Path, expect: str | None) -> dict[str, Any]:
    members = tar.getmembers()
    if not members or members[-1].name != MANIFEST or not members[-1].isfile():
        raise _damaged(archive, f"its last member is not {MANIFEST}: not a tunepilot archive, "
                       "or a truncated one")  # fmt: skip
    if members[-1].size > MAX_MANIFEST_BYTES:
        raise _damaged(archive, f"{MANIFEST} is {members[-1].size:,} bytes")
    handle = tar.extractfile(members[-1])
    data = handle.read() if handle is not None else b""
    digest = hashlib.sha256(data).hexdigest()
    if expect is not None and digest != expect.strip().lower():
        raise _damaged(archive, f"its manifest has sha256 {digest}, not the {expect} expected",
                       title="not the archive expected")  # fmt: skip
    try:
        manifest = json.loads(data)
    except ValueError:
        raise _damaged(archive, f"{MANIFEST} is not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _damaged(archive, f"{MANIFEST} is not a {FORMAT} manifest")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("bytes"), int) for v in files.values()):
        raise _damaged(archive, f"{MANIFEST} lists its files in another shape than {FORMAT}'s")
    manifest["manifest_sha256"] = digest
    return manifest


def _member_path(member: tarfile.TarInfo, archive: Path) -> str:
    """The campaign-relative path of a member, or a refusal: plain files under campaign/."""
    name = PurePosixPath(member.name)
    if (not member.isfile() or name.is_absolute() or ".." in name.parts
            or name.parts[:1] != (PREFIX,) or len(name.parts) < 2):  # fmt: skip
        kind = "a plain file" if member.isfile() else "a link or special file"
        raise _damaged(archive, f"member {member.name!r} ({kind}) is not a file under {PREFIX}/")
    return PurePosixPath(*name.parts[1:]).as_posix()


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, to: Path) -> tuple[str, int]:
    to.parent.mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    source = tar.extractfile(member)
    with to.open("xb") as out:
        while source is not None and (chunk := source.read(_CHUNK)):
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    os.chmod(to, member.mode & 0o755 | 0o600)
    return digest.hexdigest(), size


def restore_archive(archive: Path, target: Path, expect: str | None = None) -> dict[str, Any]:
    """Verify and unpack `archive` into `target` (absent or an empty folder); returns what
    was restored. Any mismatch refuses the restore and leaves `target` as it was."""
    archive, target = Path(archive).expanduser(), Path(target).expanduser().resolve()
    if not archive.is_file():
        raise input_error(str(archive), "no such archive", "give the file `tunepilot archive` "
                          "wrote")  # fmt: skip
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise input_error(str(target), "exists and is not an empty folder",
                          "restore into a new folder; nothing is restored over a campaign")
    if not target.parent.is_dir():
        raise input_error(str(target.parent), "no such folder", "create it first")
    tmp = target.with_name(f".{target.name}.restoring-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with writing(tmp, None, "`tunepilot restore` again"):
            tmp.mkdir()
            summary = _unpack(archive, tmp, expect)
            summary["interrupted"] = _settle_ledger(tmp, archive, summary["manifest"])
            if target.exists():
                target.rmdir()
            os.replace(tmp, target)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:  # truncated, torn
        raise _damaged(archive, f"it cannot be read as a tar archive ({exc})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary


def _unpack(archive: Path, into: Path, expect: str | None) -> dict[str, Any]:
    with tarfile.open(archive, "r:*") as tar:
        manifest = read_manifest(tar, archive, expect)
        listed: dict[str, Any] = dict(manifest.get("files") or {})
        members = tar.getmembers()[:-1]
        if len(members) > MAX_MEMBERS:
            raise _damaged(archive, f"{len(members):,} members, more than {MAX_MEMBERS:,}")
        problems: list[Problem] = []
        seen: set[str] = set()
        for member in members:
            rel = _member_path(member, archive)
            entry = listed.get(rel)
            if entry is None or rel in seen:
                why = "a second copy of" if rel in seen else "a file the manifest does not list:"
                raise _damaged(archive, f"{why} {rel}")
            seen.add(rel)
            if member.size != entry["bytes"]:  # refused before a byte is written
                raise _damaged(archive, f"{rel} holds {member.size:,} bytes; the manifest "
                               f"records {entry['bytes']:,}")  # fmt: skip
            try:
                digest, size = _extract(tar, member, into / rel)
            except (FileExistsError, NotADirectoryError, IsADirectoryError):
                raise _damaged(archive, f"{rel} collides with another member's folder") from None
            if (digest, size) != (entry.get("sha256"), entry.get("bytes")):
                problems.append(Problem(f"{archive}: {rel}", f"sha256 {digest[:16]}..., "
                                        f"{size:,} bytes; the manifest records "
                                        f"{str(entry.get('sha256'))[:16]}..., "
                                        f"{entry.get('bytes')} bytes",
                                        "the archive is damaged or was changed: use another "
                                        "copy; nothing was restored"))  # fmt: skip
        missing = sorted(set(listed) - seen)
        problems += [Problem(f"{archive}: {rel}", "listed in the manifest but not in the archive",
                             "use another copy; nothing was restored") for rel in missing[:20]]
        if problems:
            raise InputError(problems, title="archive refused")
    return {"manifest": manifest, "files": len(seen),
            "bytes": sum(int(x.get("bytes") or 0) for x in listed.values())}  # fmt: skip


def _settle_ledger(folder: Path, archive: Path, manifest: dict[str, Any]) -> list[str]:
    """Check the restored ledger, mark runs that were training as interrupted, note the
    restore; returns the runs marked."""
    from tunepilot.ledger import Ledger

    db = folder / "tunepilot.db"
    if not db.is_file():
        return []
    con = sqlite3.connect(db)
    try:
        check = con.execute("PRAGMA integrity_check").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        check = str(exc)
    finally:
        con.close()
    if check != "ok":
        raise _damaged(archive, f"its ledger fails SQLite's integrity check ({check})")
    at = manifest.get("created_at")
    marked = []
    with Ledger.open(folder, mark_dead=False) as ledger:
        for run in ledger.list_runs():
            if run.status == "running":
                why = (f"was training when the campaign was archived ({archive.name}, {at}); "
                       f"not running in this restored folder: resume it with `tunepilot "
                       f"resume {run.id}`")  # fmt: skip
                ledger.set_status(run.id, "interrupted", why)
                marked.append(run.id)
        ledger.add_note(f"restored from archive {archive.name} (made {at}, manifest sha256 "
                        f"{manifest['manifest_sha256']}): every file verified against it")
    return marked


def restore_command(archive: Path, target: Path, expect: str | None, as_json: bool) -> int:
    """`tunepilot restore`: verify, unpack, say what came back."""
    from tunepilot.console import console, print_json

    summary = restore_archive(archive, target, expect)
    manifest = summary.pop("manifest")
    out = {"restored": str(Path(target).expanduser().resolve()), "files": summary["files"],
           "bytes": summary["bytes"], "manifest_sha256": manifest["manifest_sha256"],
           "archived_at": manifest.get("created_at"), "ledger": manifest.get("ledger"),
           "marked_interrupted": summary["interrupted"]}  # fmt: skip
    if as_json:
        print_json(out)
        return 0
    console.print(f"restored {out['files']} files ({out['bytes'] / 2**20:.1f} MiB) into "
                  f"[bold]{out['restored']}[/], every one verified against the manifest "
                  f"(sha256 {out['manifest_sha256']}) of an archive made {out['archived_at']}",
                  highlight=False, soft_wrap=True)  # fmt: skip
    for run in summary["interrupted"]:
        console.print(f"  {run}: was training when archived; now interrupted here: "
                      f"`tunepilot resume {run}`", highlight=False, markup=False)
    return 0
