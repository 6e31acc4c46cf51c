"""`tunepilot test --final RUN`: the one look at the sealed test split (H4).

The test split only measures generalisation while nothing was chosen by looking at it. Each look
whose result feeds a choice (another learning rate, another run) turns the test split into a
second validation split, and the number it gives becomes optimistic. So every look is counted in
the ledger *before* the split is evaluated (a crash half-way still counts), a second look by any
run warns loudly and is recorded too, and `test_policy.on_second_look: refuse` keeps the seal
closed after the first look. The evaluation itself is the same procedure as everywhere (V2),
with its per-example predictions kept.
"""

from __future__ import annotations

from typing import Any

from tunepilot.data.workspace import Workspace
from tunepilot.errors import input_error

H4_WARNING = (
    "the test split has been looked at {n} times; each look used to choose erodes its value (H4)"
)


def final_test(ws: Workspace, run_id: str, as_json: bool) -> int:
    """Evaluate `run_id`'s model (or `baseline`, the starting model) on the sealed test split.

    Exit 0 after the evaluation (a second look under the `warn` policy included), 2 when the
    `refuse` policy refuses a second look (nothing is recorded then). Bad input (unknown run,
    a run that did not complete, an empty test split, another data version) raises InputError.
    """
    from tunepilot.console import console, print_json
    from tunepilot.ledger import BASELINE, Ledger

    with Ledger.open(ws.ledger_path) as ledger:
        for dead in ledger.interrupted_on_open:
            console.print(f"[yellow]marked {dead.run_id} interrupted[/]: {dead.reason}")
        row = None if run_id == BASELINE else ledger.get_run(run_id)  # unknown id: InputError
        if row is not None and row.status != "completed":
            raise input_error(
                f"run {run_id}", f"status {row.status} ({row.reason})",
                "the sealed test is for a completed run you chose with `tunepilot compare`",
                title="not a finished run",
            )  # fmt: skip
        earlier = ledger.test_looks()
        if earlier and ws.campaign.test_policy.on_second_look == "refuse":
            return _refuse(earlier, as_json)
        outcome = _look(ws, ledger, run_id, row)
    if as_json:
        print_json(outcome)
    else:
        _print(outcome)
    return 0


def _look(ws: Workspace, ledger: Any, run_id: str, row: Any) -> dict[str, Any]:
    """Build the model, count the look, then evaluate the test split and record it."""
    from tunepilot.experiments.evaluate import config_hash_of, eval_config
    from tunepilot.experiments.runner import Session, load_trained_model, predictions_from_rows

    session = Session(ws)
    if row is None:  # the baseline: the starting model, built as `tunepilot baseline` built it
        campaign, folder = ws.campaign, None
        model = session.build_model(campaign, campaign.training.seed)
    else:
        model, campaign, folder = load_trained_model(session, ledger, run_id)
    encoded = session.encoded(campaign)
    prepared = encoded.prepared
    if row is not None and row.data_version != prepared.version:
        raise input_error(
            f"run {run_id}",
            f"trained on data version {row.data_version}, the campaign now prepares "
            f"{prepared.version}: its test split may hold examples the run trained on (D1, H4)",
            "test a run trained on the current data, or restore the data it was trained on",
            title="another data version",
        )  # fmt: skip
    test = prepared.splits["test"]
    if not test:
        raise input_error(
            "data.split.test", "the test split is empty",
            "set data.split.test (e.g. 0.1) or data.files.test before training: a test split "
            "cannot be carved out after the fact without leaking into training",
            title="no sealed test split",
        )  # fmt: skip
    t = campaign.training
    config = eval_config(encoded.encoder, test, t.eval_batch_size, t.max_new_tokens)
    look_config = {
        "split": "test", "run": run_id, "data_version": prepared.version,
        "test_seal": (prepared.test_seal or {}).get("hash"),
        "checkpoint": None if folder is None else str(folder),
        "eval_config_hash": config_hash_of(config), "eval_config": config,
    }  # fmt: skip
    look = ledger.record_test_look(run_id, look_config)  # counted before the model sees it
    warning = None
    if look > 1:  # the ledger's count, which also sees looks from other processes
        warning = H4_WARNING.format(n=look)
        _warn(warning, [x for x in ledger.test_looks() if x.look_number < look])
    result = session.evaluate(model, campaign, examples=test, label="sealed test evaluation")
    evaluation_id = ledger.record_evaluation(
        run_id, "test", result.metrics, eval_config_hash=result.config_hash,
        data_version=prepared.version, update=_step(folder),
        predictions=predictions_from_rows(result.rows), test_look=look,
    )  # fmt: skip
    return {
        "run": run_id, "look": look, "looks_total": look, "warning": warning,
        "evaluation_id": evaluation_id, "eval_config_hash": result.config_hash,
        "data_version": prepared.version, "n_examples": len(test), "metrics": result.metrics,
        "earlier_looks": [
            {"look": x.look_number, "run": x.run_id, "at": x.at}
            for x in ledger.test_looks() if x.look_number < look
        ],
    }  # fmt: skip


def _step(folder: Any) -> int | None:
    """The update a checkpoint folder (step-000200) was written at; 0 for the baseline."""
    if folder is None:
        return 0
    tail = folder.name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _earlier_words(earlier: list[Any]) -> str:
    return "; ".join(f"look {x.look_number}: {x.run_id} at {x.at}" for x in earlier)


def _warn(warning: str, earlier: list[Any]) -> None:
    """Loud, on stderr so that --json output stays parseable."""
    from rich.panel import Panel

    from tunepilot.console import error_console

    body = f"{warning}.\nEarlier: {_earlier_words(earlier)}.\nThis look is recorded as well."
    error_console.print(Panel(body, title="second look at the sealed test", border_style="red"))


def _refuse(earlier: list[Any], as_json: bool) -> int:
    """The `refuse` policy: nothing is evaluated, nothing is recorded."""
    from rich.panel import Panel

    from tunepilot.console import error_console, print_json

    reason = (
        f"the test split has already been looked at {len(earlier)} time(s) "
        f"({_earlier_words(earlier)}) and test_policy.on_second_look is `refuse` (H4): "
        "report the first look's result; to look again, change the policy to `warn` and "
        "write why with `tunepilot note`"
    )
    error_console.print(Panel(reason, title="sealed test refused", border_style="red"))
    if as_json:
        print_json({"refused": True, "reason": reason, "looks_total": len(earlier)})
    return 2


def _print(outcome: dict[str, Any]) -> None:
    from rich.table import Table

    from tunepilot.console import console
    from tunepilot.experiments.compare import HEADLINE_KEYS

    m = outcome["metrics"]
    table = Table(title=f"sealed test (H4): {outcome['run']}, look {outcome['look']}")
    table.add_column("metric")
    table.add_column("value")
    for key in HEADLINE_KEYS:
        if isinstance(m.get(key), int | float):
            table.add_row(key, f"{m[key]:.4f}")
    for name, stats in (m.get("per_class") or m.get("per_field") or {}).items():
        value = stats.get("f1", stats.get("token_f1"))
        table.add_row(f"  {name}", f"{value:.4f} (support {stats.get('support')})")
    console.print(table)
    console.print(
        f"[dim]{outcome['n_examples']} test examples, data version {outcome['data_version']}, "
        f"eval config {outcome['eval_config_hash']}; recorded in the ledger[/]"
    )
