"""L4, R4: `tunepilot archive` then `tunepilot restore` round-trips a campaign folder while a
run writes to its ledger, the restored campaign exports the very same bundle bytes, and a
damaged or unexpected archive restores nothing.

The writer is a real second process (the Ledger API a run uses: registration, `running`,
curve rows, heartbeats, metrics.jsonl lines), still writing while the archive is made.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from test_export import train_run, write_campaign
from tunepilot.errors import InputError
from tunepilot.ledger import Ledger

WRITER = """
import json, os, sys, time
from pathlib import Path
from tunepilot.ledger import Ledger
root, stop = Path(sys.argv[1]), Path(sys.argv[2])
with Ledger.open(root) as ledger:
    rid = ledger.register_run(campaign="tiny-classification", variant="control", seed=1,
                              config_hash="c", data_version="d", status="running")
    print(rid, flush=True)
    folder = root / "runs" / rid
    folder.mkdir(parents=True)
    deadline, n = time.monotonic() + 120, 0
    with (folder / "metrics.jsonl").open("a") as out:
        while not stop.exists() and time.monotonic() < deadline:
            n += 1
            ledger.record_update(rid, n, 1.0 / n, lr=0.01)
            ledger.heartbeat(rid, pid=os.getpid())
            out.write(json.dumps({"update": n, "loss": 1.0 / n}) + "\\n")
            out.flush()
            time.sleep(0.005)
"""


def _campaign_with_outside_base(tmp_path: Path) -> Path:
    """test_export's campaign, its base moved to a models folder beside the campaign (where a
    user keeps bases), named by its absolute path."""
    campaign = write_campaign(tmp_path / "camp", "classification")
    models = tmp_path / "models"
    models.mkdir()
    shutil.move(tmp_path / "camp" / "base-model", models / "base-model")
    spec = yaml.safe_load(campaign.read_text())
    spec["model"]["name_or_path"] = str(models / "base-model")
    campaign.write_text(yaml.safe_dump(spec, sort_keys=False))
    return campaign


def _updates(root: Path, run_id: str) -> int:
    with Ledger.open(root, mark_dead=False) as ledger:
        return len(ledger.curve(run_id))


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def test_l4_archive_then_restore_round_trips_a_campaign_while_a_run_writes_its_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tunepilot.data.workspace import Workspace
    from tunepilot.deliver.archive import archive_command
    from tunepilot.deliver.export import export_run
    from tunepilot.deliver.restore import restore_command
    from tunepilot.experiments.compare import compare_command

    campaign = _campaign_with_outside_base(tmp_path)
    root = campaign.parent
    ws, run_id = train_run(campaign)
    assert compare_command(ws, as_json=True) == 0
    bundle = export_run(ws, run_id)
    capsys.readouterr()

    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(stop)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        writing = writer.stdout.readline().strip()  # type: ignore[union-attr]
        while _updates(root, writing) < 20:
            time.sleep(0.02)
        before = _updates(root, writing)
        assert archive_command(campaign, tmp_path / "backup.tar", as_json=True) == 0
        archived = json.loads(capsys.readouterr().out)
        while _updates(root, writing) < before + 40:  # it went on writing all along
            time.sleep(0.02)
    finally:
        stop.touch()
        assert writer.wait(timeout=60) == 0
    assert archived["ledger"]["running"] == [writing]
    names = set(_archive_names(tmp_path / "backup.tar"))
    assert "tunepilot.db" in names and not {"tunepilot.db-wal", "tunepilot.db-shm"} & names

    restored = tmp_path / "restored"
    pin = archived["manifest_sha256"]
    assert restore_command(tmp_path / "backup.tar", restored, pin, as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["marked_interrupted"] == [writing] and out["files"] == archived["files"]
    with Ledger.open(restored, mark_dead=False) as ledger:
        row = ledger.get_run(writing)
        assert row.status == "interrupted" and "was training when the campaign was archived" in (
            row.reason)  # fmt: skip
        kept = len(ledger.curve(writing))
        assert before <= kept < _updates(root, writing)  # a consistent state from the middle
        assert ledger.get_run(run_id).status == "completed"
        assert any(n.text.startswith("restored from archive backup.tar") for n in ledger.notes())
        assert [d.id for d in ledger.decisions()] == [1]

    again = export_run(Workspace.open(restored / "campaign.yaml"), run_id,
                       out=restored / "again" / run_id)  # fmt: skip
    original, copy = _files(bundle), _files(again)
    assert sorted(original) == sorted(copy)
    assert [n for n in original if original[n] != copy[n]] == []  # the same bytes, every file


def _archive_names(archive: Path) -> list[str]:
    import tarfile

    with tarfile.open(archive) as tar:
        return [m.name.removeprefix("campaign/") for m in tar.getmembers()]


def test_l4_r4_a_changed_byte_or_another_archive_restores_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import tarfile

    from tunepilot.deliver.archive import archive_command
    from tunepilot.deliver.restore import restore_archive

    root = tmp_path / "camp"
    root.mkdir()
    (root / "campaign.yaml").write_text("name: c\n")
    (root / "data.jsonl").write_text('{"text": "a"}\n' * 50)
    (root / "runs" / "r1").mkdir(parents=True)
    (root / "runs" / "r1" / "metrics.jsonl").write_text('{"update": 1}\n')
    (root / "runs" / ".tmp-step-000002-99").mkdir()  # a checkpoint being written
    (root / "runs" / ".tmp-step-000002-99" / "x.safetensors").write_bytes(b"half")
    (root / "link").symlink_to(root / "data.jsonl")
    with Ledger.open(root) as ledger:
        ledger.add_note("kept")
    assert archive_command(root, tmp_path / "a.tar.gz", as_json=True) == 0
    made = json.loads(capsys.readouterr().out)
    left = {x["path"]: x["why"] for x in made["left_out"]}
    assert left["runs/.tmp-step-000002-99"].startswith("a temporary file")
    assert left["link"].startswith("a symbolic link")

    with pytest.raises(InputError, match="not the archive expected"):
        restore_archive(tmp_path / "a.tar.gz", tmp_path / "x", expect="0" * 64)
    plain = tmp_path / "a.tar"
    with tarfile.open(tmp_path / "a.tar.gz") as src, tarfile.open(plain, "w") as dst:
        for m in src.getmembers():
            dst.addfile(m, src.extractfile(m))
    with tarfile.open(plain) as tar:
        at = tar.getmember("campaign/data.jsonl").offset_data
    data = bytearray(plain.read_bytes())
    data[at + 3] ^= 0x01
    plain.write_bytes(bytes(data))
    with pytest.raises(InputError) as err:
        restore_archive(plain, tmp_path / "y")
    assert "data.jsonl" in str(err.value) and "nothing was restored" in str(err.value)
    assert not (tmp_path / "y").exists() and not list(tmp_path.glob(".y.restoring-*"))
    restore_archive(tmp_path / "a.tar.gz", tmp_path / "z", expect=made["manifest_sha256"])
    assert (tmp_path / "z" / "data.jsonl").read_text() == (root / "data.jsonl").read_text()
    with pytest.raises(InputError, match="not an empty folder"):
        restore_archive(tmp_path / "a.tar.gz", tmp_path / "z")


@pytest.mark.parametrize("member", ["campaign/../escaped.txt", "/etc/escaped.txt", "link"])
def test_r4_a_member_outside_campaign_or_a_link_restores_nothing(tmp_path: Path, member: str):
    """A hand-made archive whose manifest vouches for a path out of the folder, or a link."""
    import hashlib
    import io
    import tarfile

    from tunepilot.deliver.archive import FORMAT, MANIFEST
    from tunepilot.deliver.restore import restore_archive

    data = b"not yours\n"
    path = tmp_path / "crafted.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo(member if member != "link" else "campaign/link")
        if member == "link":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        else:
            info.size = len(data)
        tar.addfile(info, None if member == "link" else io.BytesIO(data))
        listed = member.removeprefix("campaign/")
        manifest = json.dumps({"format": FORMAT, "files": {listed: {
            "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}}).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
    with pytest.raises(InputError, match="is not a file under campaign/"):
        restore_archive(path, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "escaped.txt").exists()
