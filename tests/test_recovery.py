"""Recovery: a copied campaign folder, resume after a refusal, a corrupt checkpoint, an explicit
resume point, a checkpoint schedule by default, and an old ledger (R1, R4, V3).

A tiny campaign (the shipped classification template on a tiny BERT) trains through the real
runner; the ledger is real SQLite. The multi-process cases (SIGTERM, a file-size limit, a
read-only folder, a file-size limit during training) are in test_recovery_processes.py.
"""

from __future__ import annotations

import contextlib
import resource
import shutil
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tunepilot.data.workspace import Workspace
from tunepilot.demo.campaign import write_demo_campaign
from tunepilot.errors import InputError
from tunepilot.experiments import flow as run_flow
from tunepilot.ledger import Ledger
from tunepilot.train.checkpoint import step_folders

ADAPTER = "adapter_model.safetensors"
SHORT = {"training.budget.updates": 6, "training.accumulation": 2, "training.eval_every": 3}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("recovery") / "X"
    return write_demo_campaign(folder, tiny=True, n_conversations=40, overrides=SHORT)


@pytest.fixture(scope="module")
def reference(campaign: Path) -> list[float]:
    """The losses of an uninterrupted control run: what every resumed run must reproduce."""
    ws = Workspace.open(campaign, ["training.keep_last_checkpoints=10"])
    run_flow.run(ws, ["control"], "0", None, as_json=True)
    with Ledger.open(ws.ledger_path) as ledger:
        return losses(ledger, ledger.list_runs()[-1].id)


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """RLIMIT_FSIZE in this process, for a block; SIGXFSZ ignored so writes fail with EFBIG."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def losses(ledger: Ledger, run_id: str) -> list[float]:
    return [p.loss for p in ledger.curve(run_id)]


def paused_run(ws: Workspace, stop_after: int, *overrides: str) -> str:
    run_flow.run(Workspace.open(ws.campaign_file, list(overrides)), ["control"], "0", stop_after,
                 as_json=True)  # fmt: skip
    with Ledger.open(ws.ledger_path) as ledger:
        row = ledger.list_runs()[-1]
    assert row.status == "interrupted", row.reason
    return row.id


def test_r1_l4_a_copied_campaign_folder_resumes_and_exports_its_own_weights(
    campaign: Path, reference: list[float], tmp_path: Path
) -> None:
    from tunepilot.deliver.export import export_run

    run_id = paused_run(Workspace.open(campaign), 2)
    copy = tmp_path / "Y"
    shutil.copytree(campaign.parent, copy, symlinks=True)
    ws = Workspace.open(copy / "campaign.yaml")
    assert run_flow.resume(ws, run_id, None, as_json=True) == 0
    bundle = export_run(ws, run_id)

    final = step_folders(copy / "runs" / run_id)[0]
    assert final.name == "step-000006"
    exported, trained = load_file(str(bundle / ADAPTER)), load_file(str(final / ADAPTER))
    assert exported.keys() == trained.keys()
    assert all(torch.equal(exported[k], trained[k]) for k in trained)
    # The original folder was never written by the copy: it still stops at update 2.
    assert step_folders(campaign.parent / "runs" / run_id)[0].name == "step-000002"
    with Ledger.open(ws.ledger_path) as ledger:
        assert losses(ledger, run_id) == reference
        assert ledger.get_run(run_id).run_dir == f"runs/{run_id}"


def test_l4_an_old_ledger_with_absolute_paths_reads_runs_under_the_current_folder(
    tmp_path: Path,
) -> None:
    """Rows written with absolute paths are never rewritten: read inside the folder, mapped
    by run id outside it, and said so."""
    here = tmp_path / "Y"
    here.mkdir()
    Ledger.open(here).close()
    con = sqlite3.connect(here / "tunepilot.db")
    rows = {"a-s0-1": "/elsewhere/X/runs/a-s0-1", "b-s0-1": str(here / "runs" / "b-s0-1")}
    for rid, folder in rows.items():
        con.execute("INSERT INTO run_ids VALUES (?, 'a', 0, 1, 'now', 1, 'h')", (rid,))
        con.execute(
            "INSERT INTO runs VALUES (?, 'c', 'a', 0, NULL, NULL, 'cfg', 'dv', NULL, '{}', '{}', "
            "?, ?, 'now', 1, 'h')", (rid, folder, folder + "/metrics.jsonl"),
        )  # fmt: skip
        con.execute("INSERT INTO run_status (run_id, status, reason, at, pid, host) "
                    "VALUES (?, 'planned', 'registered', 'now', 1, 'h')", (rid,))  # fmt: skip
    con.commit()
    con.close()
    with Ledger.open(here) as ledger:
        moved, inside = ledger.get_run("a-s0-1"), ledger.get_run("b-s0-1")
        assert (moved.run_dir, moved.metrics_file) == ("runs/a-s0-1", "runs/a-s0-1/metrics.jsonl")
        assert moved.recorded_outside == "/elsewhere/X/runs/a-s0-1"
        assert ledger.run_folder(moved) == here / "runs" / "a-s0-1"
        assert inside.run_dir == "runs/b-s0-1" and inside.recorded_outside is None
        note = ledger.relocation_note()
    assert note is not None and "/elsewhere/X/runs/a-s0-1" in note and "moved or copied" in note


def test_v3_l4_an_empty_or_missing_ledger_beside_recorded_runs_is_refused(
    tmp_path: Path,
) -> None:
    """A truncated tunepilot.db (or a copy that left it out) opened as a fresh ledger forgot
    every run and handed `control-s0-1` out again; it is refused, saying how to restore it."""
    run = tmp_path / "runs" / "control-s0-1"
    run.mkdir(parents=True)
    Ledger.open(tmp_path).close()  # a folder with a ledger and no run opens as ever
    (run / "config.resolved.yaml").write_text("name: x\n")
    for leftover in tmp_path.glob("tunepilot.db*"):
        leftover.unlink()
    with pytest.raises(InputError, match="ledger is missing") as caught:
        Ledger.open(tmp_path)
    assert "control-s0-1" in str(caught.value) and "restore tunepilot.db" in str(caught.value)
    (tmp_path / "tunepilot.db").write_bytes(b"")
    with pytest.raises(InputError, match="ledger is empty"):
        Ledger.open(tmp_path)
    assert (tmp_path / "tunepilot.db").stat().st_size == 0  # nothing written into it


def test_r1_r4_a_refused_resume_leaves_the_run_resumable_once_the_cause_is_removed(
    campaign: Path, reference: list[float]
) -> None:
    ws = Workspace.open(campaign)
    run_id = paused_run(ws, 2)
    planted = [folder / "evil.pkl" for folder in step_folders(ws.runs_dir / run_id)]
    for path in planted:
        path.write_bytes(b"\x80\x04K\x01.")  # a pickle: refused unopened (R4)
    with pytest.raises(InputError, match="no checkpoint that verifies") as caught:
        run_flow.resume(ws, run_id, None, as_json=True)
    assert "restore or remove what each refusal names" in caught.value.problems[0].fix
    with Ledger.open(ws.ledger_path) as ledger:
        row = ledger.get_run(run_id)
    assert row.status == "interrupted" and "tunepilot resume" in row.reason

    for path in planted:
        path.unlink()
    assert run_flow.resume(ws, run_id, None, as_json=True) == 0
    with Ledger.open(ws.ledger_path) as ledger:
        assert ledger.get_run(run_id).status == "completed"
        assert losses(ledger, run_id) == reference


def test_r1_a_corrupt_latest_checkpoint_falls_back_loudly_to_the_newest_that_verifies(
    campaign: Path, reference: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    ws = Workspace.open(campaign)
    run_id = paused_run(ws, 4, "training.checkpoint_every=2")
    latest = step_folders(ws.runs_dir / run_id)[0]
    assert latest.name == "step-000004"
    (latest / "MANIFEST.json").unlink()  # an incomplete checkpoint, as a lost file leaves it
    capsys.readouterr()
    assert run_flow.resume(ws, run_id, None, as_json=True) == 0
    err = capsys.readouterr().err
    assert "resuming from step-000002" in err and "step-000004 refused" in err
    with Ledger.open(ws.ledger_path) as ledger:
        assert losses(ledger, run_id) == reference
        notes = [n.text for n in ledger.notes() if n.run_id == run_id]
    assert notes and "step-000004 refused" in notes[0]


def test_r1_a_refused_newer_checkpoint_is_set_aside_and_never_costs_the_good_one(
    campaign: Path, reference: list[float]
) -> None:
    """After falling back past a corrupt checkpoint, keep-last rotation must not count it: it
    kept the broken step-4 and deleted the step-2 the run resumed from, leaving nothing that
    verifies once the newest save is damaged too."""
    from tunepilot.train.manifest import verify_checkpoint

    ws = Workspace.open(campaign)
    run_id = paused_run(ws, 4, "training.checkpoint_every=2")
    broken = step_folders(ws.runs_dir / run_id)[0] / ADAPTER
    broken.write_bytes(broken.read_bytes()[:-8] + b"\0" * 8)  # a flipped tail: sha256 differs
    resumed = Workspace.open(campaign, ["training.checkpoint_every=3"])
    assert run_flow.resume(resumed, run_id, 5, as_json=True) == 0  # saves step-3, then step-5
    root = ws.runs_dir / run_id / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [
        "refused-step-000004", "step-000003", "step-000005"]  # fmt: skip
    for folder in step_folders(ws.runs_dir / run_id):
        verify_checkpoint(folder)  # every step folder left is one a resume can use
    assert run_flow.resume(Workspace.open(campaign), run_id, None, as_json=True) == 0
    with Ledger.open(ws.ledger_path) as ledger:
        assert losses(ledger, run_id) == reference


def test_r1_resume_from_an_explicit_step_continues_the_identical_curve(
    campaign: Path, reference: list[float]
) -> None:
    ws = Workspace.open(campaign)
    run_id = paused_run(ws, 4, "training.checkpoint_every=2")
    with pytest.raises(InputError, match="step-000004, step-000002"):
        run_flow.resume_any(ws, run_id, None, True, from_step="step-3")
    assert run_flow.resume_any(ws, run_id, None, True, from_step="step-2") == 0
    metrics = (ws.runs_dir / run_id / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 6  # rewound to update 2, then 3..6 trained again
    with Ledger.open(ws.ledger_path) as ledger:
        assert losses(ledger, run_id) == reference


def test_r1_a_run_without_checkpoint_every_checkpoints_early_and_at_the_end(
    campaign: Path, reference: list[float]
) -> None:
    ws = Workspace.open(campaign)
    assert ws.campaign.training.checkpoint_every is None  # as the shipped template leaves it
    names = [p.name for p in step_folders(ws.runs_dir / "control-s0-1")]  # the reference run
    # The first save is measured after update 1; the end is always saved.
    assert names[0] == "step-000006" and names[-1] == "step-000001"


def test_r1_nothing_to_resume_names_a_command_that_works(campaign: Path) -> None:
    ws = Workspace.open(campaign)
    with Ledger.open(ws.ledger_path) as ledger:
        run_id = ledger.register_run(campaign="c", variant="control", seed=0, config_hash="x",
                                     data_version="dv", status="running")  # fmt: skip
        ledger.set_status(run_id, "interrupted", "process 1 is gone")
    with pytest.raises(InputError, match=f"--retry {run_id}") as caught:
        run_flow.resume(ws, run_id, None, as_json=True)
    assert "step-NNNNNN" not in str(caught.value)


def test_r1_the_checkpoint_schedule_keeps_saving_under_two_percent_of_the_time() -> None:
    from tunepilot.train.stopping import CheckpointSchedule

    auto = CheckpointSchedule(None)
    assert auto.due(1, 0.5)  # the first save is taken to measure it
    auto.saved(1.0)  # a 1 s save: at most 2% of the time means one per 50 s of training
    due = [auto.due(n, 0.5) for n in range(2, 102)]
    assert due.index(True) == 99 and sum(due) == 1  # after 100 updates of 0.5 s
    every = CheckpointSchedule(4)
    assert [n for n in range(1, 13) if every.due(n, 0.1)] == [4, 8, 12]


def test_r3_a_file_size_limit_at_export_and_at_a_ledger_write_is_a_sentence_not_a_traceback(
    campaign: Path, reference: list[float]
) -> None:
    from tunepilot.deliver.export import export_run

    ws = Workspace.open(campaign)
    adapter = ws.runs_dir / "control-s0-1" / "checkpoints" / "step-000006" / ADAPTER
    limit = adapter.stat().st_size // 2  # the bundle's adapter cannot be written whole
    with file_size_limit(limit), pytest.raises(InputError, match="needs about") as caught:
        export_run(ws, "control-s0-1", ws.root / "limited")
    assert "limited" in str(caught.value) and "ulimit -f" in str(caught.value)
    assert not [p for p in ws.root.iterdir() if "limited" in p.name]  # nothing half-written
    with (Ledger.open(ws.ledger_path) as ledger, file_size_limit(limit),
          pytest.raises(InputError, match="tunepilot.db") as caught):  # fmt: skip
        ledger.add_note("x" * (2 * limit))
    assert "out of space" in caught.value.title


def test_p2_every_run_records_its_trainable_parameters_in_its_folder_ledger_and_bundle(
    campaign: Path, reference: list[float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from tunepilot.deliver.flow import export_command

    ws = Workspace.open(campaign)
    on_disk = json.loads((ws.runs_dir / "control-s0-1" / "trainable.json").read_text())
    assert on_disk["method"] == "lora" and on_disk["trainable_params"] > 0
    assert on_disk["target_modules"] == ["dense", "key", "query", "value"]
    assert set(on_disk["extra_saved"]) == {"classifier", "bert.pooler"} and on_disk["rows"]
    with Ledger.open(ws.ledger_path) as ledger:
        (fact,) = ledger.facts("trainable", "control-s0-1")
    assert {k: fact[k] for k in ("trainable_params", "frozen_params", "target_modules",
            "extra_saved")} == {k: on_disk[k] for k in ("trainable_params", "frozen_params",
            "target_modules", "extra_saved")}  # fmt: skip

    # R4: the export prints the bundle's pin and the ledger keeps it.
    capsys.readouterr()
    assert export_command(ws, "control-s0-1", tmp_path / "bundle", as_json=True) == 0
    printed = json.loads(capsys.readouterr().out)
    bundle = tmp_path / "bundle"
    in_bundle = json.loads((bundle / "trainable.json").read_text())
    assert in_bundle["trainable_params"] == on_disk["trainable_params"]
    with Ledger.open(ws.ledger_path) as ledger:
        (export,) = ledger.facts("export", "control-s0-1")
    assert export["manifest_sha256"] == printed["manifest_sha256"]
    assert export["bundle"] == str(bundle)  # outside the campaign folder: kept as given


def test_r4_a_rewritten_manifest_with_an_edited_weight_passes_the_manifest_but_fails_the_pin(
    campaign: Path, reference: list[float], tmp_path: Path
) -> None:
    """What `verify` proves without a pin, and what `--expect` adds (README: guarantees)."""
    import hashlib
    import json

    from tunepilot.deliver.bundle_check import check_files
    from tunepilot.deliver.export import export_run
    from tunepilot.deliver.verify import expect_finding, manifest_digest
    from tunepilot.verdict import Verdict

    bundle = export_run(Workspace.open(campaign), "control-s0-1", tmp_path / "b")
    pin = manifest_digest(bundle)
    assert expect_finding(bundle, pin.upper()).verdict is Verdict.PASS

    weights = bundle / ADAPTER
    tensors = load_file(str(weights))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-7  # below any logit tolerance
    save_file(tensors, str(weights))
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    data = weights.read_bytes()
    manifest["files"][ADAPTER] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (bundle / "MANIFEST.json").write_text(json.dumps(manifest))

    assert all(f["verdict"] == "PASS" for f in check_files(bundle))  # the MANIFEST is fooled
    finding = expect_finding(bundle, pin)
    assert finding.verdict is Verdict.FAIL and pin in finding.sentence


def test_r4_a_pin_that_is_not_a_sha256_is_bad_input_before_any_check(
    tmp_path: Path,
) -> None:
    """A cut-off or mistyped pin is exit 2 naming --expect, not a FAIL blaming the bundle."""
    from tunepilot.deliver.verify import verify_command

    with pytest.raises(InputError, match="not a sha256") as caught:
        verify_command(tmp_path, as_json=True, expect="53429098e4")
    assert caught.value.problems[0].where == "--expect"


def test_r2_a_bundle_that_cannot_take_its_verification_record_is_still_verified(
    campaign: Path, reference: list[float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify writes its result beside the bundle for the dossier; a bundle on a read-only
    medium or a full disk still gets its verdict, with a warning that it was not recorded."""
    import json

    from tunepilot.deliver.export import export_run
    from tunepilot.deliver.verify import verification_path, verify_command

    bundle = export_run(Workspace.open(campaign), "control-s0-1", tmp_path / "b")
    capsys.readouterr()
    with file_size_limit(300):  # the record is larger; the reload reads only
        assert verify_command(bundle, as_json=True) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["verdict"] == "PASS"
    assert "not recorded" in out.err and "verification.json" in out.err
    assert not verification_path(bundle).exists()


def test_l4_a_ledger_written_at_schema_1_opens_at_schema_2_with_its_rows(tmp_path: Path) -> None:
    from tunepilot.ledger.schema import MIGRATIONS, SCHEMA_VERSION_DDL

    con = sqlite3.connect(tmp_path / "tunepilot.db")
    con.execute("PRAGMA journal_mode=WAL")
    con.execute(SCHEMA_VERSION_DDL)
    for statement in MIGRATIONS[0].statements:  # exactly what a version-1 ledger holds
        con.execute(statement)
    con.execute("INSERT INTO schema_version VALUES (1, 'v1', 'then')")
    con.execute("INSERT INTO notebook (at, text) VALUES ('then', 'kept')")
    con.commit()
    con.close()
    with Ledger.open(tmp_path) as ledger:
        assert ledger.schema_version() == len(MIGRATIONS)  # every migration since applied
        assert [n.text for n in ledger.notes()] == ["kept"]
        rid = ledger.register_run(campaign="c", variant="v", seed=0, config_hash="h",
                                  data_version="d")  # fmt: skip
        ledger.record_fact(rid, "trainable", {"trainable_params": 5})
        assert ledger.facts("trainable", rid)[0]["trainable_params"] == 5
    con = sqlite3.connect(tmp_path / "tunepilot.db")
    with pytest.raises(sqlite3.DatabaseError, match="keeps every row"):
        con.execute("UPDATE run_facts SET body = '{}'")
    con.close()


def test_l4_no_run_file_holds_a_path_into_the_campaign_folder(
    campaign: Path, reference: list[float]
) -> None:
    run = campaign.parent / "runs" / "control-s0-1"
    holding = [str(p.relative_to(run)) for p in run.rglob("*")
               if p.is_file() and p.suffix in (".json", ".yaml", ".md", ".jsonl")
               and str(campaign.parent) in p.read_text(encoding="utf-8")]  # fmt: skip
    assert holding == []
