"""The set-up half of the dossier: summary, hypothesis, data, pilot, baseline, runs (L4).

One function per section: the collected dict in, an HTML fragment out. Each section renders
what the folder holds and, when it holds nothing, says what is missing and the command that
fills it. Helpers (`e` escapes, `table`, `badge`, `missing`) live in
html.py; the SVG in charts.py; the results half (curves onwards) in results.py.
"""

from __future__ import annotations

import json
from typing import Any

from tunepilot.campaign import CLASSIFICATION_TASKS
from tunepilot.experiments.compare import HEADLINES
from tunepilot.measure.memory import human_bytes
from tunepilot.report.batch import batch_html
from tunepilot.report.elements import (
    badge,
    code,
    dl,
    e,
    flat,
    id_list,
    markdown,
    missing,
    num,
    prose,
    table,
)
from tunepilot.report.pictures import pictures_html

ROW_CLASS = {"FAIL": "r-fail", "WARN": "r-warn", "diverged": "r-fail", "failed": "r-fail",
             "interrupted": "r-warn", "invalid": "r-warn"}  # fmt: skip


def headlines(d: dict[str, Any]) -> tuple[str, ...]:
    """The metrics the comparison decides on, the same for the dossier's tables and charts."""
    return HEADLINES.get(d["title"]["task"], ("loss",))


def summary(d: dict[str, Any]) -> str:
    runs, limits = d["runs"], d["limits"]
    statuses: dict[str, int] = {}
    for r in runs:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    verification = [x["verification"]["verdict"] for x in d["exports"] if x["verification"]]
    tiles = [
        ("runs", f"{len(runs)}", ", ".join(f"{n} {s}" for s, n in statuses.items()) or "none"),
        ("data version", f'<span class="mono">{e(d["data"]["version"] or "–")}</span>', ""),
        ("pilot", badge(d["pilot"].get("verdict")) if d["pilot"].get("pilots") else "–",
         e(d["pilot"].get("id") or "no pilot")),
        ("sealed test looks", str(d["test_looks"]["count"]), ""),
        ("exports", str(len(d["exports"])),
         " ".join(badge(v) for v in verification) or ("not verified" if d["exports"] else "")),
        ("observed limits", f'<a href="#limits">{len(limits)}</a>',
         ", ".join(f"{sum(x['severity'] == s for x in limits)} {s}" for s in ("FAIL", "WARN"))),
    ]  # fmt: skip
    html = decision(d) + '<div class="tiles">' + "".join(
        f'<div class="tile"><div class="k">{k}</div><div class="v">{v}</div>'
        f'<div class="sub">{sub}</div></div>' for k, v, sub in tiles) + "</div>"  # fmt: skip
    severe = [x for x in limits if x["severity"] == "FAIL"][:3]
    if severe:
        items = "".join(f"<li>{badge('FAIL')} {prose(x['sentence'])}</li>" for x in severe)
        html += f"<p><strong>Read first:</strong></p><ul>{items}</ul>"
    return html


def decision(d: dict[str, Any]) -> str:
    cmp = d["comparison"]
    if cmp is None:
        return missing("no decision: comparison.json was never written", d["commands"]["compare"])
    kind = "adopt" if cmp.get("adopted") else ("keep" if cmp.get("comparable", True) else "none")
    return (f'<div class="callout {kind} decision"><span class="label">Decision (V7)</span>'
            f'{prose(cmp.get("decision"))}</div>')  # fmt: skip


def hypothesis(d: dict[str, Any]) -> str:
    h = d["hypothesis"]
    cur = h["current"]
    task = cur.get("task")
    guards = (
        cur.get("classification_guards")
        if task in CLASSIFICATION_TASKS
        else {**(cur.get("extraction_guards") or {}), "required_fields": cur.get("required_fields")}
    )
    html = dl([("behaviour (H1)", e(cur.get("behaviour"))), ("task", e(task)),
               ("guards (H2)", "; ".join(f"{e(k)} = {code(json.dumps(v))}"
                                         for k, v in (guards or {}).items())),
               ("hash", code(h["current_hash"]))])  # fmt: skip
    html += "<h3>As fixed in the ledger, with every amendment</h3>"
    if not h["history"]:
        html += missing("the hypothesis was never fixed in the ledger (the first baseline fixes "
                        "it)", d["commands"]["baseline"])  # fmt: skip
    else:
        original = _relevant(flat(h["history"][0]["body"]), task)
        cards = []
        for x in h["history"]:
            body = _relevant(flat(x["body"]), task)
            rows = "".join(
                f'<tr class="{"changed" if original.get(k) != v else ""}"><td>{e(k)}</td>'
                f"<td>{code(v)}</td></tr>" for k, v in body.items())  # fmt: skip
            reason = f"<p><strong>Reason:</strong> {e(x['reason'])}</p>" if x["reason"] else ""
            cards.append(f'<div class="card"><h4>{e(x["kind"])} · {e(x["at"][:19])} · '
                         f'{code(x["hash"])}</h4>{reason}'
                         f'<table class="hyp">{rows}</table></div>')  # fmt: skip
        html += '<div class="side">' + "".join(cards) + "</div>"
        if h["differs_from_ledger"]:
            html += (f"<p>{badge('WARN')} The campaign file now states hypothesis "
                     f"{code(h['current_hash'])}, not the one fixed last.</p>")  # fmt: skip
    t = h["training"]
    html += "<h3>Variants against the control (V1) and the budget (V4)</h3>"
    html += table(["variant", "what it tests", "overrides", "control"],
                  [[e("control"), "the campaign as written", "–", "–"]]
                  + [[e(n), e(v["explain"]), code(v["overrides"]), e(v["control"])]
                     for n, v in h["variants"].items()])  # fmt: skip
    html += dl([("seeds (V6)", e(", ".join(map(str, h["seeds"])))),
                ("learning rate", e(f"{t['lr']:g}")),
                ("examples per update", f"{t['microbatch']} × {t['accumulation']} accumulation"),
                ("budget", code(t["budget"])), ("validation every", f"{t['eval_every']} updates"),
                ("stop causes", code(t["stop"])), ("precision", e(t["precision"]))])  # fmt: skip
    return html


def _relevant(body: dict[str, str], task: Any) -> dict[str, str]:
    """The keys that matter for this task: a classification campaign's extraction guards are
    defaults nobody chose, and showing them would suggest they were judged."""
    skip = (
        ("extraction_guards", "required_fields", "target_schema")
        if task in CLASSIFICATION_TASKS
        else ("classification_guards",)
    )
    return {k: v for k, v in body.items() if not k.startswith(skip)}


def data(d: dict[str, Any]) -> str:
    x, cmd = d["data"], d["commands"]
    if x["version"] is None:
        return missing("no prepared data version in this folder", cmd["audit"])
    splits = x.get("splits") or {}
    counts = splits.get("counts") or {}
    html = dl([("data version (D1)", code(x["version"])),
               ("split policy (D8)", code(splits.get("policy") or "–")),
               ("labels", e(", ".join(splits.get("label_names") or []) or "–")),
               ("sealed test (H4)", (f"{x['seal']['n_ids']} ids, hash {code(x['seal']['hash'])}, "
                                     f"sealed {e(x['seal']['created_at'])}") if x["seal"] else "–"),
               ("versions on disk", e(", ".join(x["versions_present"]) or "–"))])  # fmt: skip
    if counts:
        html += table(["split", "examples"], [[e(k), num(v)] for k, v in counts.items()],
                      "compact")  # fmt: skip
    cleaning = splits.get("cleaning") or []
    if cleaning:
        html += "<details><summary>cleaning rules and what they changed</summary>" + table(
            ["rule", "changed", "dropped", "e.g."],
            [[e(c.get("rule")), num(c.get("changed")), num(c.get("dropped")),
              id_list(c.get("example_ids"))] for c in cleaning],
        ) + "</details>"  # fmt: skip
    html += pictures_html(x.get("pictures")) + batch_html(x.get("batch"), cmd["batch"])
    html += "<h3>Audit (D2-D8)</h3>"
    if x["audit"] is None:
        return html + missing(f"no audit.json for version {x['version']}", cmd["audit"])
    findings = x["audit"]["findings"]
    html += table(["check", "verdict", "what was seen / what to do", "e.g.", "req"],
                  [[e(f.get("check")), badge(f.get("verdict")), e(f.get("sentence")),
                    id_list(f.get("examples")), e(f.get("requirement"))]
                   for f in findings], "audit",
                  [ROW_CLASS.get(str(f.get("verdict")), "") for f in findings])  # fmt: skip
    return html


def _inputs(i: Any) -> str:
    if not isinstance(i, dict):
        return "–"
    shape = f"{i.get('microbatch', '?')}" + (f"×{i['length']}" if i.get("length") else "")
    parts = [
        shape,
        f"acc {i.get('accumulation', '?')}",
        str(i.get("precision", "")),
        f"world {i.get('world_size', 1)}",
    ] + (["ckpt"] if i.get("activation_checkpointing") else [])
    parts = [p for p in parts if p]
    lines = [" · ".join(parts[:2]), " · ".join(parts[2:])]
    return "<br>".join(f'<span class="nowrap">{e(x)}</span>' for x in lines if x)


def _memory_cell(mem: Any, counter: str) -> str:
    """Peak and what the phase added, per device, for one counter: never summed (S5)."""
    if not isinstance(mem, dict):
        return "–"
    cells = []
    for r in mem.get("readings") or []:
        if r.get("counter") == counter and r.get("peak_bytes") is not None:
            dev = f"{e(r.get('device'))}: " if len(mem.get("devices") or []) > 1 else ""
            delta = _bytes(r.get("peak_delta_bytes"))
            cells.append(
                f'<span class="nowrap">{dev}{_bytes(r["peak_bytes"])}</span><br>'
                f'<span class="muted nowrap">+{delta}</span>'
            )
    return "<br>".join(cells) or "–"


def _bytes(n: Any) -> str:
    """Bytes for a person; anything that is not a number (a missing counter) reads `n/a`."""
    return human_bytes(n if isinstance(n, int | float) else None)


def gate_table(rows: list[dict[str, Any]]) -> str:
    """One row per phase: inputs, one column per memory counter, duration, verdict (S5)."""
    counters = list(
        dict.fromkeys(c for r in rows for c in ((r.get("memory") or {}).get("counters") or []))
    )
    head = ["#", "phase", "inputs", *(f"{e(c)} peak (+phase)" for c in counters), "time",
            "verdict", "what was seen", "req"]  # fmt: skip
    body = [[num(r.get("number")), f'<span class="nowrap">{e(r.get("phase"))}</span>',
             _inputs(r.get("inputs")), *(_memory_cell(r.get("memory"), c) for c in counters),
             f'<span class="nowrap">{r["duration_s"]:.2f} s</span>'
             if isinstance(r.get("duration_s"), int | float) else "–",
             badge(r.get("verdict")), e(r.get("sentence")), e(r.get("requirement"))]
            for r in rows]  # fmt: skip
    return table(head, body, "gates", [ROW_CLASS.get(str(r.get("verdict")), "") for r in rows])


def pilot(d: dict[str, Any]) -> str:
    p, cmd = d["pilot"], d["commands"]
    if not p.get("pilots"):
        return missing("no pilot has run for this campaign: no gate table, sizing sheet or "
                       "rental plan", cmd["pilot"])  # fmt: skip
    env = p.get("env") or {}
    html = dl([("pilot", f"{code(p['id'])} {badge(p.get('verdict'))}"),
               ("run at", e(p.get("created"))), ("device", e(p.get("device"))),
               ("stack", e(f"torch {env.get('torch')} ({env.get('backend')}), python "
                           f"{env.get('python')}") if env else "–"),
               ("configuration", code(p.get("config_hash")) + (" = the campaign now" if
                p.get("matches_campaign") else f" {badge('WARN')} the campaign is now "
                f"{code(d['title']['config_hash'])}")),
               ("stale", e(p["stale"]) if p.get("stale") else "no"),
               ("all pilots", e(", ".join(f"{x['id']} ({x['verdict']})"
                                          for x in p["pilots"])))])  # fmt: skip
    gates = gate_table(p["rows"]) if p["rows"] else missing("gates.json holds no rows",
                                                            cmd["pilot"])  # fmt: skip
    html += "<h3>Gate table (S4, S5)</h3>" + gates
    replicas = next((r for r in p["rows"] if r.get("phase") == "replicas"), None)
    per_rank = (replicas or {}).get("ranks") or []
    if per_rank:  # gate 14: the step gates again in every rank of a DDP or FSDP campaign
        html += ("<h3>Every rank, every phase (S4, S5, B3, B4)</h3>" + gate_table(
            [r | {"phase": f"{r.get('phase')} (rank {r.get('rank')})"} for r in per_rank]))
    s = p.get("sizing")
    html += "<h3>Sizing sheet (S1, S7, L1)</h3>"
    if not isinstance(s, dict):
        html += missing("no sizing.json in the pilot folder", cmd["plan"])
    else:
        items = [("measured on", e(s.get("measured_on") or "cpu")),
                 ("target card", e(s.get("target") or "none set")),
                 ("examples per update", e((s.get("updates") or {}).get("sentence"))),
                 ("memory model", e((s.get("memory_model") or {}).get("sentence"))),
                 ("held-out check", f"{badge((s.get('holdout') or {}).get('verdict'))} "
                                    f"{e((s.get('holdout') or {}).get('sentence'))}"),
                 ("recommendation", e(s.get("recommendation_sentence"))),
                 ("plan", e(s.get("sentence")))]  # fmt: skip
        html += dl([(k, v) for k, v in items if v and v != "–"])
    md = p.get("plan_md")
    parts = md_sections(md or "")
    sheet_md = next((v for k, v in parts.items() if k.startswith("Per-card sheet")), "")
    if sheet_md:  # the sheet as the plan wrote it: phases, a row per card, S3, assumptions
        html += markdown(sheet_md)
    html += "<h3>Rental plan (L3)</h3>"
    if not md:
        return html + missing("no plan.md in the pilot folder", cmd["plan"])
    plan_md = next((v for k, v in parts.items()  # a package, or why the card gets none
                    if k.startswith(("Rental plan", "No rental plan"))), "")
    if not plan_md:  # the pilot measures; the per-card sheet and package come from the plan
        html += missing("the pilot measured this machine; no per-card sheet or package yet",
                        cmd["plan"])  # fmt: skip
    else:
        html += markdown(plan_md)
    return html + ("<details><summary>the pilot's plan.md as written</summary>"
                   f"{markdown(md)}</details>")  # fmt: skip


def md_sections(md: str) -> dict[str, str]:
    """plan.md cut at its `## ` headings: {heading: body}."""
    out: dict[str, str] = {}
    current = ""
    for line in md.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            out[current] = ""
        elif current:
            out[current] += line + "\n"
    return out


def baseline(d: dict[str, Any]) -> str:
    evals = d["baseline"]["evaluations"]
    if not evals:
        return missing("the starting model was never evaluated (H3)", d["commands"]["baseline"])
    from tunepilot.experiments.guards import baseline_note

    keys = headlines(d)
    notes = {n for x in evals if (n := baseline_note({"reference": x.get("reference")}))}
    return ("<p>The starting model, evaluated before any training on a split kept apart from "
            "training; its per-example predictions are kept in the ledger (H3).</p>"
            + "".join(f"<p><strong>Note:</strong> {e(n)}.</p>" for n in sorted(notes)) + table(
        ["split", "update", *keys, "loss", "examples", "predictions kept", "eval config",
         "data version", "at"],
        [[e(x["split"]), num(x["update"]), *(num(x["metrics"].get(k)) for k in keys),
          num(x["metrics"].get("loss")), num(x["metrics"].get("n")), num(x["n_predictions"]),
          code(x["eval_config_hash"]), code(x["data_version"]), e(x["at"][:19])]
         for x in evals]))  # fmt: skip


def runs(d: dict[str, Any]) -> str:
    every = d["runs"]
    if not every:
        return missing("no run in the ledger", d["commands"]["run"])
    rows = [r for r in every if r.get("full", True)]  # the rest: one summary row per variant
    # Runs that differ in configuration must not read as seeds of one experiment: each
    # distinct configuration (seed left out) gets a short tag (cfg 1, cfg 2 ...) and the
    # settings it changes against the campaign.
    key = headlines(d)[0]
    config = {r["id"]: r.get("config_key") or r["config_hash"] for r in every}
    tags = {h: f"cfg {i + 1}" for i, h in enumerate(dict.fromkeys(config.values()))}
    summary = variant_summary(d, key, config) if len(rows) < len(every) else ""
    body = []
    for r in rows:
        last = r["curve"][-1][0] if r["curve"] else 0
        trail = " → ".join(s["status"] for s in r["history"])
        retry = ""
        if r["retry_of"]:
            retry += f"retry of {code(r['retry_of'])} "
        if r["retried_by"]:
            retry += "retried by " + ", ".join(code(x) for x in r["retried_by"])
        changes = "; ".join(f"{e(k)} {e(v[0])} → {e(v[1])}" if isinstance(v, list) and len(v) == 2
                            else f"{e(k)} {e(v)}" for k, v in (r.get("diff") or {}).items())
        setting = (f'<span class="badge" title="config hash {e(r["config_hash"])} (seed '
                   f'included), data version {e(r["data_version"])}">{tags[config[r["id"]]]}'
                   f'</span> {changes or "<span class=muted>the control</span>"}')  # fmt: skip
        body.append([code(r["id"]), badge(r["status"]), f'<div class="reason">{e(r["reason"])}'
                     f"{'<br>' + retry if retry else ''}</div>", setting, num(last),
                     num(r["final"].get(key)),
                     f'<span class="nowrap" title="{e(trail)}">'
                     f'{e(r["created_at"][5:16].replace("T", " "))}</span>'])  # fmt: skip
    html = summary + (
        "<p>Every run the ledger holds, in the order registered, failures included (V3); "
        "a retry is a new id pointing at the run it retries. Runs with the same cfg tag ran "
        "the same configuration (hover it for the config hash and data version).</p>"
        if not summary else f"<h3>The chosen variants' runs in full ({len(rows)})</h3>"
    )
    html += table(["run", "status", "reason", "configuration (changes vs the campaign)",
                   "updates", f"final {e(key)}", "created"], body, "runs",
                  [ROW_CLASS.get(r["status"], "") for r in rows])  # fmt: skip
    by_variant: dict[str, set[str]] = {}
    for r in every:
        by_variant.setdefault(r["variant"], set()).add(config[r["id"]])
    mixed = sorted(v for v, keys in by_variant.items() if len(keys) > 1)
    if mixed:
        html += ("<p><strong>Different configurations under one name:</strong> "
                 + e(", ".join(mixed)) + " ran under more than one configuration (the campaign "
                 "file changed between runs); compare runs only within one cfg tag (V1, V2).</p>")
    backends = d["environment"]["backends"]
    if backends:
        said = "; ".join(f"{code(b['backend'])}"
                         + (f", {e(b['runtime'])}" if b.get("runtime") else "")
                         + f" ({len(b['runs'])} run(s))" for b in backends)  # fmt: skip
        html += f"<p>Measured on: {said} (B2).</p>"
    return html


def variant_summary(d: dict[str, Any], key: str, config: dict[str, str]) -> str:
    """One row per variant, every run counted (V3): runs by status, seeds, configurations, the
    final metric's mean and spread over completed runs, and the first runs that ended badly.
    Shown when the dossier draws only the chosen variants' runs (report/scale.py)."""
    import statistics

    groups: dict[str, list[dict[str, Any]]] = {}
    for r in d["runs"]:
        groups.setdefault(r["variant"], []).append(r)
    body = []
    for name, runs in groups.items():
        statuses: dict[str, int] = {}
        for r in runs:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        finals = [r["final"][key] for r in runs if r["status"] == "completed"
                  and isinstance(r["final"].get(key), int | float)]  # fmt: skip
        spread = (f"{statistics.fmean(finals):.4f}" + (f" ± {statistics.stdev(finals):.4f}"
                  if len(finals) > 1 else "")) if finals else "–"  # fmt: skip
        bad = [r["id"] for r in runs if r["status"] in ("diverged", "failed", "interrupted")]
        body.append([e(name), num(len(runs)), e(", ".join(f"{n} {s}" for s, n in statuses.items())),
                     num(len({r["seed"] for r in runs})), num(len({config[r["id"]] for r in runs})),
                     spread, id_list(bad) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")])
    shown = sum(r.get("full", True) for r in d["runs"])
    return (f"<p>{num(len(d['runs']))} runs in the ledger, failures included (V3): one row per "
            f"variant below; the {shown} runs of the variants the decision is about (the "
            "control and the adopted, else the best, variant) follow in full. "
            f'<code class="cmd">tunepilot runs</code> lists every run.</p>'
            + table(["variant", "runs", "by status", "seeds", "configurations",
                     f"final {e(key)} (mean ± std, completed)", "ended badly"], body,
                    "variants"))  # fmt: skip
