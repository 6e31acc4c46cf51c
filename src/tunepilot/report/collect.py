"""Everything the dossier shows, gathered from the campaign folder into one plain dict (L4, L5).

Read only: the ledger, data/<version>/{splits,audit}.json, pilots/<id>/{gates,sizing}.json and
plan.md, runs/<id>/{metrics,evals}.jsonl, comparison.json, exports/<run-id>/ and the
verification beside each bundle. Nothing is recomputed or trained, so the dossier says what the
evidence on disk says, and `tunepilot report --json` prints exactly what the HTML renders.

Every reader tolerates a missing file or key: a section with nothing behind it is kept, with a
`missing` sentence that names the command that would fill it. The observed limits (L5) are
derived from this dict (`tunepilot.report.limits`), never written as fixed prose.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tunepilot.campaign import stable_hash
from tunepilot.console import json_safe
from tunepilot.data.workspace import Workspace
from tunepilot.report.batch import read_batch
from tunepilot.report.config_key import config_key
from tunepilot.report.examples import changed_examples
from tunepilot.report.limits import observed_limits
from tunepilot.report.per_class import per_class_series
from tunepilot.report.pictures import data_pictures
from tunepilot.report.scale import shown_in_full
from tunepilot.train.runtime import runtime_line

ENDED_BADLY = ("diverged", "interrupted", "failed", "invalid")


def read_json(path: Path) -> Any:
    """The JSON at `path`, or None when it is absent or unreadable (the dossier says so)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON lines at `path` (a torn last line, from a killed writer, is skipped)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def scalars(metrics: Any) -> dict[str, Any]:
    """The top-level numbers of a metrics dict (per-class blocks left out)."""
    if not isinstance(metrics, dict):
        return {}
    return {k: v for k, v in metrics.items() if isinstance(v, int | float | str | None)}


def _mtime(path: Path) -> str | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds")
    except OSError:
        return None


# --------------------------------------------------------------------------------------------


def collect(ws: Workspace) -> dict[str, Any]:
    """The whole dossier as plain JSON-ready data."""
    from tunepilot import __version__
    from tunepilot.campaign.checks import campaign_warnings

    c = ws.campaign
    cf = ws.campaign_file.name
    d: dict[str, Any] = {
        "schema": "tunepilot-dossier/1",
        "title": {
            "campaign": c.name, "task": c.hypothesis.task, "behaviour": c.hypothesis.behaviour,
            "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "tunepilot_version": __version__, "config_hash": c.config_hash(),
            "campaign_file": str(ws.campaign_file), "folder": str(ws.root),
            "model": c.model.name_or_path, "revision": c.model.revision, "method": c.model.method,
            "warnings": [str(w) for w in campaign_warnings(c)],
        },
        "commands": {k: v.format(cf=cf) for k, v in COMMANDS.items()},
    }  # fmt: skip
    ledger_data = _from_ledger(ws)
    d["hypothesis"] = _hypothesis(ws, ledger_data.pop("history"))
    d["runs"] = ledger_data.pop("runs")
    d.update(ledger_data)
    d["pilot"] = _pilot(ws)
    d["data"] = _data(ws, d["runs"], d["pilot"])
    d["comparison"] = _comparison(ws, d["runs"])
    d["per_class"] = per_class_series(ws, d["baseline"], d["comparison"])
    d["examples"] = changed_examples(ws, d["runs"], d["comparison"])  # fixed / broke (H3)
    d["exports"] = _exports(ws, d["runs"])
    d["environment"] = _environment(ws, d["runs"], d["pilot"])
    d["limits"] = observed_limits(d)  # last: derived from everything above
    return json_safe(d)


COMMANDS = {
    "baseline": "tunepilot baseline {cf}",
    "audit": "tunepilot data audit {cf}",
    "batch": "tunepilot data show {cf} --batch",
    "pilot": "tunepilot pilot {cf}",
    "plan": "tunepilot plan {cf}",
    "run": "tunepilot run {cf}",
    "compare": "tunepilot compare {cf}",
    "test": "tunepilot test --final RUN {cf}",
    "note": 'tunepilot note "what you decided and why" {cf}',
    "export": "tunepilot export RUN {cf}",
    "verify": "tunepilot verify exports/RUN",
    "report": "tunepilot report {cf}",
}


def _from_ledger(ws: Workspace) -> dict[str, Any]:
    """Runs, baseline, hypothesis history, test looks and notes, from the ledger if it exists
    (the report never creates one: an empty folder stays empty)."""
    policy = ws.campaign.test_policy.on_second_look
    out: dict[str, Any] = {"runs": [], "history": [], "baseline": {"evaluations": []},
                           "test_looks": {"looks": [], "count": 0, "policy": policy},
                           "notes": [], "decisions": [],
                           "ledger": {"exists": ws.ledger_path.is_file(),
                                                   "marked": []}}  # fmt: skip
    if not ws.ledger_path.is_file():
        return out
    from tunepilot.ledger import BASELINE, Ledger

    cmp = read_json(ws.root / "comparison.json")
    with Ledger.open(ws.ledger_path) as ledger:  # marks runs whose process died (V3)
        out["ledger"]["marked"] = [f"{x.run_id}: {x.reason}" for x in ledger.interrupted_on_open]
        rows = ledger.list_runs()
        full = shown_in_full(rows, cmp if isinstance(cmp, dict) else None)
        finals: dict[str, Any] = {}  # each run's last validation evaluation, in one query
        for e in ledger.evaluations(split="validation"):
            finals[e.run_id] = e
        keys: dict[str, str | None] = {}
        out["runs"] = [_run(ws, ledger, r, r.id in full, finals, keys) for r in rows]
        out["history"] = [{"kind": h.kind, "hash": h.hash, "reason": h.reason, "at": h.at,
                           "body": h.body} for h in ledger.hypothesis_history()]  # fmt: skip
        out["baseline"]["evaluations"] = [_evaluation(e) for e in ledger.evaluations(BASELINE)]
        tests = {e.test_look: e for e in ledger.evaluations(split="test")}
        looks = [{"number": t.look_number, "run_id": t.run_id, "at": t.at,
                  "config_hash": t.config_hash,
                  "metrics": scalars(tests[t.look_number].metrics) if t.look_number in tests
                  else None} for t in ledger.test_looks()]  # fmt: skip
        out["test_looks"] = {"looks": looks, "count": len(looks), "policy": policy}
        out["notes"] = [{"id": n.id, "at": n.at, "run_id": n.run_id, "text": n.text}
                        for n in ledger.notes()]  # fmt: skip
        out["decisions"] = [x.to_json() for x in ledger.decisions()]  # every one, in order (L4)
    retried_by: dict[str, list[str]] = {}
    for r in out["runs"]:
        if r["retry_of"]:
            retried_by.setdefault(r["retry_of"], []).append(r["id"])
    for r in out["runs"]:
        r["retried_by"] = retried_by.get(r["id"], [])
    return out


def _evaluation(e: Any) -> dict[str, Any]:
    blocks = {k: v for k, v in e.metrics.items() if k in ("per_class", "per_field", "reference")}
    return {"id": e.id, "split": e.split, "update": e.update, "metrics": scalars(e.metrics),
            **blocks, "eval_config_hash": e.eval_config_hash, "data_version": e.data_version,
            "at": e.at, "n_predictions": e.n_predictions}  # fmt: skip


def _run(ws: Workspace, ledger: Any, row: Any, full: bool, finals: dict[str, Any],
         keys: dict[str, str | None]) -> dict[str, Any]:  # fmt: skip
    """One run as the dossier shows it. A run not shown in full (scale.py) keeps its line's
    facts (status, reason, final metrics, configuration, backend); its curve, validation
    points and status history are read only for the runs the page draws."""
    folder = ledger.run_folder(row)  # under this campaign folder, even when it was moved
    curve: dict[int, float | None] = {}
    for rec in read_jsonl(folder / "metrics.jsonl") if full else []:  # the loop's record (V5)
        if isinstance(rec.get("update"), int):
            loss = rec.get("loss")
            curve[rec["update"]] = float(loss) if isinstance(loss, int | float) else None
    source = "metrics.jsonl" if full else "not shown"
    if full and not curve:
        curve = {p.update: p.loss for p in ledger.curve(row.id)}
        source = "ledger" if curve else "none"
    evals = [{"update": rec["update"], "metrics": scalars(rec["eval"])}
             for rec in (read_jsonl(folder / "evals.jsonl") if full else [])
             if isinstance(rec.get("update"), int)
             and isinstance(rec.get("eval"), dict)]  # fmt: skip
    final = finals.get(row.id)
    return {
        "id": row.id, "variant": row.variant, "seed": row.seed, "status": row.status,
        "reason": row.reason, "retry_of": row.retry_of, "data_version": row.data_version,
        "config_hash": row.config_hash, "control_run": row.control_run, "diff": row.diff,
        "budget": row.budget, "created_at": row.created_at, "status_at": row.status_at,
        "full": full,
        "history": [{"status": s.status, "reason": s.reason, "at": s.at}
                    for s in (ledger.status_history(row.id) if full else [])],
        "curve": [[u, curve[u]] for u in sorted(curve)], "curve_source": source,
        "evals": evals, "final": scalars(final.metrics) if final else {},
        "config_key": config_key(folder, keys),
        "env": _env_summary(read_json(folder / "env.json")),
    }  # fmt: skip


def _env_summary(env: Any) -> dict[str, Any] | None:
    if not isinstance(env, dict):
        return None
    torch = env.get("torch") or {}
    devices = [str(x.get("name")) for x in env.get("devices") or [] if isinstance(x, dict)]
    return {"python": (env.get("python") or {}).get("version"), "torch": torch.get("version"),
            "backend": torch.get("backend"), "cuda": torch.get("cuda"), "devices": devices,
            "cpu": (env.get("cpu") or {}).get("model"),
            "packages": env.get("packages") or {},
            "runtime": runtime_line(env.get("runtime"))}  # fmt: skip


# --------------------------------------------------------------------------------------------


def _hypothesis(ws: Workspace, history: list[dict[str, Any]]) -> dict[str, Any]:
    c = ws.campaign
    current = c.hypothesis.model_dump(mode="json")
    now = stable_hash(current)
    t = c.training
    return {
        "current": current, "current_hash": now, "history": history,
        "fixed_hash": history[-1]["hash"] if history else None,
        "differs_from_ledger": bool(history) and history[-1]["hash"] != now,
        "variants": {n: {"explain": v.explain, "overrides": v.overrides, "control": v.control}
                     for n, v in c.variants.items()},
        "seeds": list(c.seeds),
        "training": {"lr": t.lr, "microbatch": t.microbatch, "accumulation": t.accumulation,
                     "budget": t.budget.model_dump(), "eval_every": t.eval_every,
                     "precision": t.precision, "stop": t.stop.model_dump()},
    }  # fmt: skip


def _data(ws: Workspace, runs: list[dict[str, Any]], pilot: dict[str, Any]) -> dict[str, Any]:
    """The data version the runs used (else the pilot's, else the newest on disk)."""
    folder = ws.root / "data"
    on_disk = sorted((p for p in folder.glob("*/splits.json")), key=lambda p: p.stat().st_mtime)
    present = [p.parent.name for p in on_disk]
    used = list(dict.fromkeys(r["data_version"] for r in runs))
    version = (used[-1] if used else None) or pilot.get("data_version") or (
        present[-1] if present else None)  # fmt: skip
    out: dict[str, Any] = {"version": version, "versions_present": present,
                           "versions_in_runs": used, "splits": None, "audit": None,
                           "seal": read_json(ws.root / "data" / "test_seal.json")}  # fmt: skip
    if version is None:
        out["missing"] = "no prepared data version in this folder"
        return out
    splits = read_json(folder / version / "splits.json")
    if isinstance(splits, dict):
        splits.pop("ids", None)  # thousands of ids: the file keeps them
        out["splits"] = splits
    out["pictures"] = data_pictures(folder / version)  # contact sheet, near duplicates
    out["batch"] = read_batch(folder / version / "batch.json")  # data show --batch (D3)
    audit = read_json(folder / version / "audit.json")
    if isinstance(audit, dict):
        out["audit"] = {"findings": [f for f in audit.get("findings") or [] if isinstance(f, dict)],
                        "written_at": _mtime(folder / version / "audit.json")}  # fmt: skip
    if out["seal"]:
        out["seal"] = {"hash": out["seal"].get("hash"), "created_at": out["seal"].get("created_at"),
                       "n_ids": len(out["seal"].get("ids") or [])}  # fmt: skip
    return out


def _pilot(ws: Workspace) -> dict[str, Any]:
    """The latest pilot (gate table, sizing sheet, plan) and the list of every pilot."""
    found = sorted(p for p in ws.pilots_dir.glob("p-*") if (p / "gates.json").is_file())
    if not found:
        return {"pilots": []}
    pilots = []
    for p in found:
        g = read_json(p / "gates.json") or {}
        pilots.append({"id": p.name, "verdict": g.get("verdict"), "created": g.get("created"),
                       "config_hash": g.get("config_hash"), "device": g.get("device"),
                       "stale": read_json(p / "STALE.json")})  # fmt: skip
    latest = found[-1]
    gates = read_json(latest / "gates.json") or {}
    rows = []
    for r in gates.get("rows") or []:
        if isinstance(r, dict):
            rows.append({k: r.get(k) for k in ("number", "phase", "inputs", "memory", "duration_s",
                                               "verdict", "sentence", "requirement")})  # fmt: skip
            if r.get("phase") == "replicas":  # one row per rank per phase (S5)
                rows[-1]["ranks"] = (r.get("details") or {}).get("rows") or []
    try:
        plan_md = (latest / "plan.md").read_text(encoding="utf-8")
    except OSError:
        plan_md = None
    return {
        "pilots": pilots, "id": latest.name, "created": gates.get("created"),
        "verdict": gates.get("verdict"), "device": gates.get("device"),
        "config_hash": gates.get("config_hash"), "data_version": gates.get("data_version"),
        "matches_campaign": gates.get("config_hash") == ws.campaign.config_hash(),
        "measurements": gates.get("measurements") or {}, "rows": rows,
        "env": _env_summary(gates.get("env")), "sizing": read_json(latest / "sizing.json"),
        "plan_md": plan_md, "stale": read_json(latest / "STALE.json"),
    }  # fmt: skip


def _comparison(ws: Workspace, runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    path = ws.root / "comparison.json"
    cmp = read_json(path)
    if not isinstance(cmp, dict):
        return None
    written = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    later = [r["id"] for r in runs if _after(r.get("status_at"), written)]
    cmp["written_at"] = written.isoformat(timespec="seconds")
    cmp["runs_changed_since"] = later  # the comparison does not know about these yet
    return cmp


def _after(at: str | None, moment: datetime) -> bool:
    try:
        return at is not None and datetime.fromisoformat(at) > moment
    except ValueError:
        return False


def _exports(ws: Workspace, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every bundle under exports/, then every other export the ledger recorded (`export
    --out`): one inside the campaign folder is read like the others; one outside it is listed
    from the ledger only (its path and pin), never read."""
    from tunepilot.ledger import Ledger

    status = {r["id"]: r["status"] for r in runs}
    folders = sorted(p for p in ws.exports_dir.iterdir() if p.is_dir()
                     and not p.name.startswith(".")) if ws.exports_dir.is_dir() else []  # fmt: skip
    out = [_bundle_entry(folder, status) for folder in folders]
    seen = {f.resolve() for f in folders}
    facts = []
    if ws.ledger_path.is_file():
        with Ledger.open(ws.ledger_path) as ledger:
            facts = ledger.facts("export")
    root = ws.root.resolve()
    for fact in facts:
        where = Path(str(fact.get("bundle") or ""))
        folder = (where if where.is_absolute() else root / where).resolve()
        if folder in seen or not str(fact.get("bundle") or ""):
            continue
        seen.add(folder)
        if folder.is_relative_to(root) and folder.is_dir():
            out.append(_bundle_entry(folder, status))
            continue
        out.append({"name": str(folder), "folder": str(folder), "run_id": fact.get("run_id"),
                    "run_status": status.get(fact.get("run_id")), "has_manifest": None,
                    "pin": fact.get("manifest_sha256"), "n_files": 0, "bytes": 0,
                    "weights": "outside the campaign folder, not read", "method": "see ledger",
                    "data_version": None, "format": None, "base": {}, "verification": None,
                    "outside": True})  # fmt: skip
    return out


def _bundle_entry(folder: Path, status: dict[str, str]) -> dict[str, Any]:
    from tunepilot.deliver.verify import manifest_digest, verification_path

    manifest = read_json(folder / "MANIFEST.json") or {}
    files = manifest.get("files") or {}
    bundle, base = (read_json(folder / name) or {} for name in ("bundle.json", "base.json"))
    pin = manifest_digest(folder) if manifest else None  # what `verify --expect` compares
    check = read_json(verification_path(folder))
    run_id = bundle.get("run_id") or folder.name
    return {
        "name": folder.name, "folder": str(folder), "run_id": run_id,
        "run_status": status.get(run_id), "has_manifest": bool(manifest), "pin": pin,
        "n_files": len(files), "bytes": sum(int(f.get("bytes") or 0) for f in files.values()),
        "weights": bundle.get("weights"), "method": bundle.get("method"),
        "data_version": bundle.get("data_version"), "format": bundle.get("format"),
        "base": {k: base.get(k) for k in ("name", "revision", "resolved_commit", "kind")}
        | {"weight_files": len(base.get("weight_files") or {})},
        "verification": None if not isinstance(check, dict) else {
            "verdict": check.get("verdict"), "at": check.get("at"),
            "findings": [f for f in check.get("findings") or [] if isinstance(f, dict)]},
    }  # fmt: skip


def _environment(
    ws: Workspace, runs: list[dict[str, Any]], pilot: dict[str, Any]
) -> dict[str, Any]:
    """The backends the runs were measured on (B1, B2): one entry per distinct fingerprint."""
    groups: dict[str, dict[str, Any]] = {}
    for r in runs:
        env = r.get("env")
        if env:
            key = f"{env['torch']} / {env['backend']} / {', '.join(env['devices']) or env['cpu']}"
            runtime = env.get("runtime") or ""  # precision, optimizer, TF32 (train/runtime.py)
            groups.setdefault(key + runtime, {"backend": key, "runtime": runtime,
                                              "runs": []})["runs"].append(r["id"])
    return {"backends": list(groups.values()), "pilot": pilot.get("env")}
