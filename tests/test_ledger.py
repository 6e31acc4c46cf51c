"""The ledger, one process at a time (V1, V3, V5, H1, H3, H4, L4).

Real SQLite files in tmp folders; the multi-process and dead-process tests are in
test_ledger_concurrency.py.
"""

from __future__ import annotations

import math
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tunepilot.errors import InputError
from tunepilot.ledger import BASELINE, DB_NAME, Ledger, Prediction


@pytest.fixture
def ledger(tmp_path: Path):
    with Ledger.open(tmp_path) as opened:
        yield opened


def _run(ledger: Ledger, variant: str = "lr1e-4", seed: int = 0, **kw) -> str:
    return ledger.register_run(
        campaign="demo", variant=variant, seed=seed, config_hash="cfg", data_version="dv1", **kw
    )


def test_ledger_file_is_wal_sqlite_in_the_campaign_folder_with_schema_version(tmp_path: Path):
    with Ledger.open(tmp_path) as led:
        assert led.path == tmp_path / DB_NAME
        assert led.schema_version() == 3
    con = sqlite3.connect(tmp_path / DB_NAME)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("SELECT count(*) FROM schema_version").fetchone()[0] == 3
    con.close()
    with Ledger.open(tmp_path / DB_NAME) as again:  # reopening migrates nothing twice
        assert again.schema_version() == 3


def test_ledger_refuses_a_newer_schema_and_a_file_that_is_not_a_ledger(tmp_path: Path):
    Ledger.open(tmp_path).close()
    con = sqlite3.connect(tmp_path / DB_NAME)
    con.execute("INSERT INTO schema_version VALUES (99, 'future', 'now')")
    con.commit()
    con.close()
    with pytest.raises(InputError, match="newer than this tunepilot"):
        Ledger.open(tmp_path)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(InputError, match="not a readable ledger"):
        Ledger.open(junk)
    with pytest.raises(InputError, match="folder does not exist"):
        Ledger.open(tmp_path / "missing" / DB_NAME)


def test_v1_run_ids_are_variant_seed_n_and_never_reused(ledger: Ledger):
    assert ledger.new_run_id("lr1e-4", 0) == "lr1e-4-s0-1"
    # reserved but never registered: still never handed out again
    assert _run(ledger) == "lr1e-4-s0-2"
    assert _run(ledger, seed=1) == "lr1e-4-s1-1"
    assert _run(ledger, variant="lr5e-5") == "lr5e-5-s0-1"
    # an explicit id that looks like a future one is skipped over, not shared
    assert _run(ledger, run_id="lr1e-4-s0-3") == "lr1e-4-s0-3"
    assert ledger.new_run_id("lr1e-4", 0) == "lr1e-4-s0-4"
    with pytest.raises(InputError, match="already registered"):
        _run(ledger, run_id="lr1e-4-s0-2")
    with pytest.raises(InputError, match="variant"):
        ledger.new_run_id("bad name/..", 0)
    with pytest.raises(InputError, match="seed"):
        ledger.new_run_id("ok", -1)
    with pytest.raises(InputError, match="run_id"):
        _run(ledger, run_id=BASELINE)


def test_v2_run_records_seed_budget_data_version_diff_and_metrics_pointer(ledger: Ledger):
    rid = _run(
        ledger,
        variant="lr2e-4",
        seed=2,
        eval_config_hash="ev1",
        control_run="lr1e-4",
        diff={"training.lr": 2e-4},
        budget={"updates": 200, "examples_per_update": 16},
        run_dir=Path("runs") / "lr2e-4-s2-1",
    )
    row = ledger.get_run(rid)
    assert (row.variant, row.seed, row.control_run) == ("lr2e-4", 2, "lr1e-4")
    assert (row.config_hash, row.data_version, row.eval_config_hash) == ("cfg", "dv1", "ev1")
    assert row.diff == {"training.lr": 2e-4}
    assert row.budget == {"updates": 200, "examples_per_update": 16}
    assert row.metrics_file == str(Path("runs/lr2e-4-s2-1/metrics.jsonl"))
    assert (row.status, row.reason, row.retry_of) == ("planned", "registered", None)
    with pytest.raises(InputError, match="data_version"):
        ledger.register_run(
            campaign="demo", variant="x", seed=0, config_hash="cfg", data_version=""
        )


def test_v3_status_changes_are_new_rows_in_order_and_the_latest_is_current(ledger: Ledger):
    rid = _run(ledger)
    ledger.set_status(rid, "running")
    ledger.set_status(rid, "diverged", "loss was NaN at update 37")
    ledger.set_status(rid, "invalid", "eval config differed from the control")
    history = ledger.status_history(rid)
    assert [h.status for h in history] == ["planned", "running", "diverged", "invalid"]
    assert history[2].reason == "loss was NaN at update 37"
    assert [h.at for h in history] == sorted(h.at for h in history)
    current = ledger.current_status(rid)
    assert (current.status, current.reason) == ("invalid", "eval config differed from the control")
    when = datetime.fromisoformat(current.at)
    assert when.tzinfo is not None and when.utcoffset() == UTC.utcoffset(None)


def test_v3_bad_endings_need_a_reason_and_finished_results_are_never_replaced(ledger: Ledger):
    rid = _run(ledger)
    ledger.set_status(rid, "running")
    for status in ("diverged", "interrupted", "invalid", "failed"):
        with pytest.raises(InputError, match="without a reason"):
            ledger.set_status(rid, status, "  ")
    ledger.set_status(rid, "completed")
    with pytest.raises(InputError, match="completed cannot become running") as err:
        ledger.set_status(rid, "running")
    assert "retry" in str(err.value)
    with pytest.raises(InputError, match="use one of"):
        ledger.set_status(rid, "done")
    with pytest.raises(InputError, match="no such run"):
        ledger.set_status("nope-s0-1", "running")
    with pytest.raises(InputError, match="no such run"):
        ledger.current_status("nope-s0-1")
    assert [h.status for h in ledger.status_history(rid)] == ["planned", "running", "completed"]


def test_v3_nothing_in_the_ledger_can_be_deleted_or_overwritten(ledger: Ledger):
    rid = _run(ledger)
    ledger.add_note("keep me")
    con = sqlite3.connect(ledger.path)
    for sql in (
        "DELETE FROM run_status",
        "UPDATE run_status SET status = 'completed'",
        "DELETE FROM runs",
        "UPDATE runs SET seed = 7",
        "DELETE FROM notebook",
        "UPDATE run_ids SET n = 1",
    ):
        with pytest.raises(sqlite3.IntegrityError, match="keeps every row"):
            con.execute(sql)
    con.close()
    assert ledger.current_status(rid).status == "planned"
    assert [n.text for n in ledger.notes()] == ["keep me"]


def test_v3_retry_is_a_new_id_pointing_at_the_original_which_keeps_its_line(ledger: Ledger):
    rid = _run(ledger, run_dir="runs/lr1e-4-s0-1", diff={"training.lr": 1e-4})
    ledger.set_status(rid, "running")
    with pytest.raises(InputError, match="still running"):
        ledger.retry(rid)
    ledger.set_status(rid, "failed", "CUDA out of memory at microbatch 8")
    new = ledger.retry(rid, "microbatch 4 x 4 accumulations", config_hash="cfg-b4")
    assert new == "lr1e-4-s0-2"
    retried = ledger.get_run(new)
    assert retried.retry_of == rid and retried.config_hash == "cfg-b4"
    assert retried.diff == {"training.lr": 1e-4} and retried.run_dir == str(
        Path("runs/lr1e-4-s0-2")
    )
    assert retried.status == "planned" and rid in retried.reason
    rows = ledger.list_runs()
    assert [(r.id, r.status) for r in rows] == [(rid, "failed"), (new, "planned")]
    assert rows[0].reason == "CUDA out of memory at microbatch 8"
    with pytest.raises(InputError, match="no such run"):
        ledger.retry("ghost-s0-1")


def test_v5_curve_keeps_nan_losses_and_the_latest_row_per_update(ledger: Ledger):
    rid = _run(ledger)
    ledger.record_updates(
        rid,
        [
            {"update": 1, "loss": 2.5, "lr": 1e-4, "tokens": 512},
            {"update": 2, "loss": float("nan"), "lr": 1e-4, "grad_norm": float("inf")},
        ],
    )
    ledger.record_update(rid, 1, 2.25, 1e-4)  # a resume re-recorded update 1
    points = ledger.curve(rid)
    assert [p.update for p in points] == [1, 2]
    assert points[0].loss == 2.25 and points[0].extra == {}
    assert math.isnan(points[1].loss) and points[1].extra == {"grad_norm": float("inf")}
    with pytest.raises(InputError, match="update and loss"):
        ledger.record_updates(rid, [{"loss": 1.0}])
    with pytest.raises(InputError, match="no such run"):
        ledger.record_update("ghost-s0-1", 1, 1.0)


def test_h3_evaluations_keep_per_example_predictions_with_their_types(ledger: Ledger):
    preds = [
        Prediction("ex-1", gold=3, pred=3, score=1.0, row={"text": "card lost"}),
        Prediction("ex-2", gold=3, pred=7, score=0.0),
        {"example_id": "ex-3", "gold": {"city": "Oslo"}, "pred": "not json", "score": 0.0},
    ]
    base = ledger.record_evaluation(
        BASELINE,
        "validation",
        {"macro_f1": 0.31, "per_class": {"3": {"f1": 0.5}}},
        eval_config_hash="ev1",
        data_version="dv1",
        predictions=preds,
    )
    rid = _run(ledger)
    at_100 = ledger.record_evaluation(
        rid, "validation", {"macro_f1": 0.6}, eval_config_hash="ev1", data_version="dv1", update=100
    )
    assert [e.id for e in ledger.evaluations()] == [base, at_100]
    (only_base,) = ledger.evaluations(run_id=BASELINE)
    assert only_base.metrics["per_class"]["3"]["f1"] == 0.5 and only_base.n_predictions == 3
    assert ledger.evaluations(run_id=rid)[0].update == 100
    back = ledger.predictions(base)
    assert [p.example_id for p in back] == ["ex-1", "ex-2", "ex-3"]
    assert back[0] == preds[0] and back[1].pred == 7 and isinstance(back[1].gold, int)
    assert back[2].gold == {"city": "Oslo"} and back[2].pred == "not json"
    with pytest.raises(InputError, match="evaluation"):
        ledger.predictions(999)


def test_h3_a_duplicate_example_id_refuses_the_whole_evaluation(ledger: Ledger):
    with pytest.raises(InputError, match="'ex-1' twice"):
        ledger.record_evaluation(
            BASELINE,
            "validation",
            {},
            eval_config_hash="ev1",
            data_version="dv1",
            predictions=[Prediction("ex-1", 1, 1), Prediction("ex-1", 1, 2)],
        )
    assert ledger.evaluations() == []  # one transaction: nothing half-written
    with pytest.raises(InputError, match="split"):
        ledger.record_evaluation(BASELINE, "dev", {}, eval_config_hash="e", data_version="d")


def test_h4_every_look_at_the_test_split_is_counted_and_a_test_evaluation_needs_one(
    ledger: Ledger,
):
    a, b = _run(ledger), _run(ledger, variant="lr2e-4")
    with pytest.raises(InputError, match="test_look"):
        ledger.record_evaluation(a, "test", {}, eval_config_hash="e", data_version="d")
    assert ledger.record_test_look(a, {"eval": "ev1", "split": "test"}) == 1
    assert ledger.record_test_look(b, {"eval": "ev1"}) == 2
    assert ledger.record_test_look(a, {"eval": "ev1"}) == 3
    looks = ledger.test_looks()
    assert [(t.look_number, t.run_id) for t in looks] == [(1, a), (2, b), (3, a)]
    assert looks[0].config == {"eval": "ev1", "split": "test"} and looks[1].config_hash
    with pytest.raises(InputError, match="record a look"):  # b's look does not cover a
        ledger.record_evaluation(a, "test", {}, eval_config_hash="e", data_version="d", test_look=2)
    eid = ledger.record_evaluation(
        a, "test", {"acc": 0.9}, eval_config_hash="e", data_version="d", test_look=3
    )
    assert ledger.evaluations(split="test")[0].id == eid
    with pytest.raises(InputError, match="test_look"):
        ledger.record_evaluation(
            a, "validation", {}, eval_config_hash="e", data_version="d", test_look=1
        )
    with pytest.raises(InputError, match="no such run"):
        ledger.record_test_look("ghost-s0-1", {})


def test_l4_notebook_entries_are_timestamped_and_can_name_a_run(ledger: Ledger):
    rid = _run(ledger)
    first = ledger.add_note("lr 2e-4 diverged at update 37; keep 1e-4 as control")
    ledger.add_note("loss flat after update 150", run_id=rid)
    notes = ledger.notes()
    assert [n.id for n in notes][0] == first and len(notes) == 2
    assert notes[1].run_id == rid and datetime.fromisoformat(notes[1].at).tzinfo is not None
    assert [n.text for n in ledger.notes(run_id=rid)] == ["loss flat after update 150"]
    with pytest.raises(InputError, match="empty"):
        ledger.add_note("   ")
    with pytest.raises(InputError, match="no such run"):
        ledger.add_note("about a ghost", run_id="ghost-s0-1")


def test_h1_hypothesis_is_fixed_once_and_an_amendment_needs_a_reason(ledger: Ledger):
    body = {"behaviour": "route banking questions", "guards": {"per_class_f1_drop": 0.02}}
    digest = ledger.fix_hypothesis(body)
    assert ledger.fix_hypothesis(dict(reversed(body.items()))) == digest  # same content: no-op
    changed = {**body, "guards": {"per_class_f1_drop": 0.05}}
    with pytest.raises(InputError, match="changed since it was fixed"):
        ledger.fix_hypothesis(changed)
    amended = ledger.fix_hypothesis(changed, reason="class 12 has 9 examples; 0.02 is noise")
    assert amended != digest
    history = ledger.hypothesis_history()
    assert [(h.kind, h.hash) for h in history] == [("original", digest), ("amendment", amended)]
    assert history[0].body == body and history[0].reason is None
    assert history[1].reason == "class 12 has 9 examples; 0.02 is noise"
