"""Observed limits (L5): what the evidence in the campaign folder says the result cannot claim.

Derived from the collected dossier, never written as fixed prose: a data audit that warned, a
guard that fails for the chosen configuration, runs that did not finish, a test split looked
at more than once, pilot gates that did not pass, a pilot measured on another configuration or
backend, CPU measurements standing in for GPU ones, a bundle nobody verified. Each rule reads
one part of the dict and returns limits of the form

    {"area", "severity": FAIL | WARN | INFO, "sentence", "requirement"}

so a colleague reading the dossier months later sees, in one list, how far to trust it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunepilot.data.version import version_parts

Limit = dict[str, str]
ORDER = {"FAIL": 0, "WARN": 1, "INFO": 2}
SMALL_VALIDATION = 200  # below this many examples, one example moves accuracy by > 0.5 points


def _limit(area: str, severity: str, sentence: str, requirement: str = "") -> Limit:
    return {"area": area, "severity": severity, "sentence": sentence, "requirement": requirement}


def _ids(items: list[str], n: int = 4) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def campaign_limits(d: dict[str, Any]) -> list[Limit]:
    """Settings the campaign file chose that a reader must weigh (trust_remote_code ...)."""
    return [_limit("campaign", "WARN", w, "R4") for w in d["title"].get("warnings", [])]


def hypothesis_limits(d: dict[str, Any]) -> list[Limit]:
    h, cmd = d["hypothesis"], d["commands"]
    out = []
    if not h["history"]:
        out.append(_limit("hypothesis", "WARN", "the hypothesis and guards were never fixed in "
                          "the ledger, so nothing shows they were stated before the results "
                          f"(`{cmd['baseline']}` fixes them)", "H1, H2"))  # fmt: skip
    amendments = [x for x in h["history"] if x["kind"] == "amendment"]
    if amendments:
        reasons = "; ".join(f"{x['at'][:19]}: {x['reason']}" for x in amendments)
        out.append(_limit("hypothesis", "WARN", f"the hypothesis was amended {len(amendments)} "
                          f"time(s) after it was fixed ({reasons}); results recorded before an "
                          "amendment were judged against the earlier guards",
                          "H1, H2"))  # fmt: skip
    if h["differs_from_ledger"]:
        out.append(_limit("hypothesis", "WARN", f"the campaign file's hypothesis (hash "
                          f"{h['current_hash']}) differs from the one fixed in the ledger "
                          f"({h['fixed_hash']}): the next baseline asks for the amendment's "
                          "reason", "H1"))  # fmt: skip
    return out


def data_limits(d: dict[str, Any]) -> list[Limit]:
    data, cmd = d["data"], d["commands"]
    if data["version"] is None:
        return [_limit("data", "WARN", "no prepared data version: the data was never audited "
                       f"here (`{cmd['audit']}`)", "D1-D8")]  # fmt: skip
    out = []
    if data["audit"] is None:
        out.append(_limit("data", "WARN", f"no saved audit for data version {data['version']}: "
                          "duplicates, leakage between splits and truncation are unchecked "
                          f"(`{cmd['audit']}`)", "D2, D8"))  # fmt: skip
    else:
        for f in data["audit"]["findings"]:
            if f.get("verdict") in ("WARN", "FAIL"):
                out.append(_limit("data", f["verdict"], f"data audit, {f.get('check')}: "
                                  f"{f.get('sentence')}", f.get("requirement") or ""))  # fmt: skip
    used = data["versions_in_runs"]
    example_sets = list(dict.fromkeys(version_parts(v)[0] for v in used))
    if len(example_sets) > 1:
        out.append(_limit("data", "WARN", f"the runs used {len(example_sets)} example sets "
                          f"(data versions {_ids(used)}); only runs on the same examples are "
                          "compared", "D1, V2"))  # fmt: skip
    elif len(used) > 1:
        out.append(_limit("data", "INFO", f"the runs used {len(used)} encodings of the same "
                          f"examples (data versions {_ids(used)}: max_length, template or "
                          "tokenizer variants); they are compared unless an encoding cut "
                          "answers", "D1, S6"))  # fmt: skip
    counts = (data.get("splits") or {}).get("counts") or {}
    n = counts.get("validation")
    if isinstance(n, int) and 0 < n < SMALL_VALIDATION:
        out.append(_limit("data", "INFO", f"the validation split holds {n} examples: one "
                          f"example moves accuracy by {100 / n:.1f} points, so smaller "
                          "differences are within that grain", "V6"))  # fmt: skip
    if not counts.get("test"):
        out.append(_limit("data", "WARN", "no sealed test split: no number in this dossier "
                          "comes from data that was never used to choose", "H4"))  # fmt: skip
    return out


def baseline_limits(d: dict[str, Any]) -> list[Limit]:
    if any(e["split"] == "validation" for e in d["baseline"]["evaluations"]):
        return []
    return [_limit("baseline", "WARN", "no baseline evaluation: no result is shown against the "
                   "starting model and the guards vs the baseline are not judged "
                   f"(`{d['commands']['baseline']}`)", "H3")]  # fmt: skip


def run_limits(d: dict[str, Any]) -> list[Limit]:
    runs = d["runs"]
    if not runs:
        return [_limit("runs", "INFO", "no run in the ledger: there is no result yet "
                       f"(`{d['commands']['run']}`)", "V1")]  # fmt: skip
    out = []
    for status in ("diverged", "interrupted", "failed", "invalid"):
        bad = [r for r in runs if r["status"] == status]
        if bad:
            said = "; ".join(f"{r['id']} ({r['reason']})" for r in bad[:3])
            more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
            out.append(_limit("runs", "WARN", f"{len(bad)} run(s) {status}: {said}{more}; they "
                              "keep their line in the runs table but give no result for their "
                              "seed", "V3"))  # fmt: skip
    unfinished = [r["id"] for r in runs if r["status"] in ("running", "planned")]
    if unfinished:
        out.append(_limit("runs", "WARN", f"{len(unfinished)} run(s) still running or planned "
                          f"when this dossier was written ({_ids(unfinished)}): their results "
                          "are not in it", "V3"))  # fmt: skip
    for line in d["ledger"]["marked"]:
        out.append(_limit("runs", "INFO", f"marked interrupted while writing this dossier: "
                          f"{line}", "V3"))  # fmt: skip
    backends = d["environment"]["backends"]
    if len(backends) > 1:
        out.append(_limit("runs", "WARN", f"the runs were measured on {len(backends)} backends "
                          f"({'; '.join(b['backend'] for b in backends)}): numbers from "
                          "different stacks are not directly comparable", "B1, B2"))  # fmt: skip
    return out


def comparison_limits(d: dict[str, Any]) -> list[Limit]:
    cmp, cmd = d["comparison"], d["commands"]
    if cmp is None:
        if not d["runs"]:
            return []
        return [_limit("comparison", "WARN", "no comparison.json: no decision is recorded "
                       f"(`{cmd['compare']}`)", "V5-V7")]  # fmt: skip
    out = []
    if cmp.get("runs_changed_since"):
        out.append(_limit("comparison", "WARN", f"{len(cmp['runs_changed_since'])} run(s) "
                          "changed after comparison.json was written "
                          f"({_ids(cmp['runs_changed_since'])}): the decision does not include "
                          f"them (`{cmd['compare']}`)", "V5"))  # fmt: skip
    chosen = cmp.get("adopted") or "control"
    for v in cmp.get("variants") or []:
        if v.get("name") != chosen:
            continue
        for g in v.get("guards") or []:
            if g.get("verdict") in ("FAIL", "WARN"):
                out.append(_limit("guards", g["verdict"], f"the chosen configuration "
                                  f"`{chosen}` {'fails' if g['verdict'] == 'FAIL' else 'warns on'}"
                                  f" {g.get('check')}: {g.get('sentence')}", "H2"))  # fmt: skip
        used = [r for r in v.get("runs") or [] if r.get("excluded") is None]
        if len(used) == 1:
            out.append(_limit("comparison", "INFO", f"`{chosen}` rests on one seed: how much its "
                              "result moves from seed to seed is unknown", "V6"))  # fmt: skip
    not_compared = [r["run_id"] for v in cmp.get("variants") or [] for r in v.get("runs") or []
                    if str(r.get("excluded") or "").startswith("not compared")]  # fmt: skip
    if not_compared:
        out.append(_limit("comparison", "WARN", f"{len(not_compared)} completed run(s) were "
                          "evaluated under another eval config or data version and left out "
                          f"of the numbers ({_ids(not_compared)})", "V2"))  # fmt: skip
    return out


def test_limits(d: dict[str, Any]) -> list[Limit]:
    looks = d["test_looks"]
    if looks["count"] == 0 and not any(r["status"] == "completed" for r in d["runs"]):
        return []  # nothing to look at yet: not a limit of a result that does not exist
    if looks["count"] == 0:
        return [_limit("sealed test", "INFO", "the sealed test split was never looked at: every "
                       "number here is a validation number, from the split used to choose, so "
                       "it is optimistic; look once at the chosen run "
                       f"(`{d['commands']['test']}`)", "H4")]  # fmt: skip
    if looks["count"] > 1:
        runs = _ids([str(x["run_id"]) for x in looks["looks"]])
        return [_limit("sealed test", "WARN", f"the sealed test split was looked at "
                       f"{looks['count']} times ({runs}): each look used to choose erodes its "
                       "value; only the first is a clean estimate", "H4")]  # fmt: skip
    return []


def pilot_limits(d: dict[str, Any]) -> list[Limit]:
    p, cmd = d["pilot"], d["commands"]
    if not p.get("pilots"):
        return [_limit("pilot", "WARN", "no pilot: memory, time and the rental plan were never "
                       f"measured (`{cmd['pilot']}`)", "S1-S7, L1-L3")]  # fmt: skip
    out = []
    audited = d["data"]["audit"] is not None and p.get("data_version") == d["data"]["version"]
    for r in p["rows"]:
        if r.get("phase") == "data" and audited:
            continue  # the data gate repeats the audit, whose findings are listed one by one
        if r.get("verdict") in ("WARN", "FAIL"):
            out.append(_limit("pilot", r["verdict"], f"pilot gate {r.get('number')} "
                              f"({r.get('phase')}): {r.get('sentence')}",
                              r.get("requirement") or ""))  # fmt: skip
    if p.get("stale"):
        changes = "; ".join(map(str, p["stale"].get("backend_changes") or []))
        out.append(_limit("pilot", "WARN", f"pilot {p['id']} is stale: the backend changed "
                          f"since ({changes})", "B1"))  # fmt: skip
    if not p.get("matches_campaign"):
        out.append(_limit("pilot", "WARN", f"pilot {p['id']} measured configuration "
                          f"{p.get('config_hash')}, but the campaign is now "
                          f"{d['title']['config_hash']}: its gates and sizing describe another "
                          f"configuration (`{cmd['pilot']}`)", "S4, L2"))  # fmt: skip
    sizing = p.get("sizing") or {}
    if str(p.get("device") or "").startswith("cpu") or sizing.get("measured_on") == "cpu":
        out.append(_limit("pilot", "INFO", "the pilot ran on CPU: its memory figures are process "
                          "RSS and its times CPU times, so GPU memory and hours in the sizing "
                          "sheet and rental plan are estimates; rerun the pilot on the rented "
                          "card", "S5, B1, L2"))  # fmt: skip
    return out


def export_limits(d: dict[str, Any]) -> list[Limit]:
    exports, cmd = d["exports"], d["commands"]
    if not exports:
        return [_limit("delivery", "INFO", "nothing exported: there is no bundle to deliver "
                       f"(`{cmd['export']}`)", "R3, L5")]  # fmt: skip
    out = []
    for e in exports:
        check = e.get("verification")
        if check is None:
            out.append(_limit("delivery", "WARN", f"bundle {e['name']} was never reloaded and "
                              f"replayed (`tunepilot verify {e['folder']}`)", "R2"))  # fmt: skip
        elif check.get("verdict") == "FAIL":
            bad = [f"{f.get('check')}: {f.get('sentence')}" for f in check["findings"]
                   if f.get("verdict") == "FAIL"]  # fmt: skip
            out.append(_limit("delivery", "FAIL", f"bundle {e['name']} failed its reload check: "
                              + "; ".join(bad[:3]), "R2, R4"))  # fmt: skip
        if e.get("run_status") not in (None, "completed"):
            out.append(_limit("delivery", "FAIL", f"bundle {e['name']} holds run {e['run_id']}, "
                              f"now marked {e['run_status']}", "V3"))  # fmt: skip
    adopted = (d["comparison"] or {}).get("adopted")
    variants = {r["id"]: r["variant"] for r in d["runs"]}
    if adopted and not any(variants.get(e["run_id"]) == adopted for e in exports):
        out.append(_limit("delivery", "WARN", f"`{adopted}` was adopted but no bundle holds one "
                          "of its runs", "L5"))  # fmt: skip
    return out


RULES: tuple[Callable[[dict[str, Any]], list[Limit]], ...] = (
    campaign_limits, hypothesis_limits, data_limits, baseline_limits, pilot_limits, run_limits,
    comparison_limits, test_limits, export_limits,
)  # fmt: skip


def observed_limits(d: dict[str, Any]) -> list[Limit]:
    """Every rule's limits, FAILs first, then WARNs, then INFOs (stable within each)."""
    out = [x for rule in RULES for x in rule(d)]
    return sorted(out, key=lambda x: ORDER.get(x["severity"], 3))
