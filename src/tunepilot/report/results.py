"""The results half of the dossier: curves, comparison, per class, test looks, notebook,
exports and the observed limits (V3, V5-V7, H2-H4, L4, L5, R2).

One function per section: the collected dict in, an HTML fragment out; a section with nothing
behind it says what is missing and the command that fills it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tunepilot.report import charts
from tunepilot.report.elements import badge, code, dl, e, missing, num, prose, run_colours, table
from tunepilot.report.sections import ROW_CLASS, decision, headlines


def _series(d: dict[str, Any], metric: str | None) -> tuple[list[charts.Series], list[Any]]:
    colours = run_colours(d)
    seeds = sorted({r["seed"] for r in d["runs"]})
    out = []
    for r in d["runs"]:
        if metric is None:
            pts = [(float(u), v) for u, v in r["curve"]]
        else:
            pts = [(float(x["update"]), x["metrics"].get(metric)) for x in r["evals"]
                   if isinstance(x["metrics"].get(metric), int | float)]  # fmt: skip
        if not pts:
            continue
        end = {"diverged": "diverged", "interrupted": "stopped", "failed": "stopped"}.get(
            r["status"], "") if metric is None else ""  # fmt: skip
        out.append(charts.Series(r["variant"], colours[r["variant"]], pts,
                                 charts.DASHES[seeds.index(r["seed"]) % len(charts.DASHES)],
                                 end, dots=metric is not None, label=r["id"]))  # fmt: skip
    return out, seeds


def _legend(d: dict[str, Any], series: list[charts.Series], seeds: list[Any]) -> str:
    colours = run_colours(d)
    names = list(dict.fromkeys(s.name for s in series))
    items = [(n, colours[n], "box") for n in names]
    if len(seeds) > 1:
        items += [(f"seed {seeds[i]}", "#6b7280", "dash" if dash else "line")
                  for i, dash in enumerate(charts.DASHES[: len(seeds)])][:4]  # fmt: skip
    if any(s.end == "diverged" for s in series):
        items.append(("diverged (the run stops here)", "#374151", "cross"))
    if any(s.end == "stopped" for s in series):
        items.append(("interrupted / failed", "#374151", "ring"))
    return charts.legend(items)


def curves(d: dict[str, Any]) -> str:
    loss, seeds = _series(d, None)
    if not loss:
        return missing("no run has written a loss curve", d["commands"]["run"])
    # The raw loss is noisy update to update: a smoothed line on top shows the trend, the faint
    # raw one underneath keeps every point (TensorBoard's debiased moving average).
    weight = 0.9 if max(len(s.points) for s in loss) > 100 else 0.6
    layered = [replace(s, faint=True, end="", label=f"{s.label} (raw)") for s in loss] + [
        replace(s, points=charts.smoothed(s.points, weight)) for s in loss]  # fmt: skip
    html = "<h3>Training loss per update, every run (V5)</h3>" + _legend(d, loss, seeds)
    html += (f'<p class="muted">Solid: smoothed (moving average, weight {weight}); faint: the '
             "raw loss of every update.</p>")  # fmt: skip
    html += charts.line_chart(layered, title="training loss per update", x_label="update",
                              y_label="loss", x_min=0)  # fmt: skip
    pair = []
    for metric in headlines(d):
        points, _ = _series(d, metric)
        block = f"<div><h3>Validation {e(metric)} at each evaluation point</h3>"
        if points:
            block += _legend(d, points, seeds) + charts.line_chart(
                points, title=f"validation {metric}", x_label="update", y_label=metric,
                width=540, height=260, x_min=0)  # fmt: skip
        else:
            block += missing(f"no evaluation point recorded {metric}")
        pair.append(block + "</div>")
    html += '<div class="pair">' + "".join(pair) + "</div>"
    cards = []
    colours = run_colours(d)
    for r in d["runs"]:
        pts = [(float(u), v) for u, v in r["curve"]]
        end = {"diverged": "diverged", "interrupted": "stopped", "failed": "stopped"}.get(
            r["status"], ""
        )
        chart = charts.line_chart([charts.Series(r["variant"], colours[r["variant"]], pts, end=end,
                                                 label=r["id"])], title=f"loss of {r['id']}",
                                  x_label="update", y_label="loss", width=320, height=170,
                                  x_min=0) if pts else ""  # fmt: skip
        cards.append(f'<div class="card">{code(r["id"])} {badge(r["status"])}{chart}'
                     f'<p>{e(r["reason"])}</p></div>')  # fmt: skip
    return (
        html
        + "<h3>Each run on its own</h3>"
        + '<div class="grid-runs">'
        + "".join(cards)
        + "</div>"
    )


def _mean_std(summary: Any) -> str:
    if not isinstance(summary, dict) or summary.get("mean") is None:
        return "–"
    std = summary.get("std")
    return f"{summary['mean']:.4f}" + (f" ± {std:.4f}" if isinstance(std, int | float) else "")


def _variant_row(v: dict[str, Any], keys: list[str], colour: str) -> list[str]:
    """One variant over its seeds: used/total, mean ± std, every seed, the CI, the guards."""
    ci, runs = v.get("ci"), v.get("runs") or []
    used = [r for r in runs if r.get("excluded") is None]
    summary = v.get("summary") or {}
    per_seed = (summary.get(keys[0]) or {}).get("values") or {}
    verdicts = {g.get("verdict") for g in v.get("guards") or []}
    worst = next((w for w in ("FAIL", "WARN", "PASS") if w in verdicts), None)
    swatch = f'<span class="swatch" style="background:{colour}"></span> {e(v["name"])}'
    seeds = f"{len(used)}/{len({r.get('seed') for r in runs})}"
    shown = f"{ci['diff']:+.4f} [{ci['low']:+.4f}, {ci['high']:+.4f}]" if ci else "–"
    return [swatch, seeds, *(_mean_std(summary.get(k)) for k in keys),
            e(", ".join(f"s{s}: {x:.3f}" for s, x in per_seed.items())) or "–", shown,
            badge(worst) if worst else "–"]  # fmt: skip


def _intervals(d: dict[str, Any], cmp: dict[str, Any], colours: dict[str, str]) -> str:
    with_ci = [v for v in cmp.get("variants") or [] if isinstance(v.get("ci"), dict)]
    if not with_ci:
        return missing("no variant has an interval (none completed on a seed the control also "
                       "completed)", d["commands"]["run"])  # fmt: skip
    rows = [charts.Interval(v["name"], colours.get(v["name"], "#999"), v["ci"]["diff"],
                            v["ci"]["low"], v["ci"]["high"]) for v in with_ci]  # fmt: skip
    ci = with_ci[0]["ci"]
    chart = charts.interval_chart(rows, title="difference to the control",
                                  metric=str(ci.get("metric")),
                                  level=float(ci.get("level", 0.95)))  # fmt: skip
    return chart + (f"<p>Paired bootstrap over {num(ci.get('n_examples'))} validation "
                    f"examples, {num(ci.get('resamples'))} resamples, seeds "
                    f"{e(ci.get('seeds'))}: a variant is adopted only when its whole interval "
                    "lies above 0 and its guards pass.</p>")  # fmt: skip


def comparison(d: dict[str, Any]) -> str:
    cmp = d["comparison"]
    if cmp is None:
        return missing("comparison.json was never written: no per-variant numbers, intervals or "
                       "decision", d["commands"]["compare"])  # fmt: skip
    keys, colours = list(headlines(d)), run_colours(d)
    variants = cmp.get("variants") or []
    html = decision(d)
    if cmp.get("runs_changed_since"):
        changed = ", ".join(code(x) for x in cmp["runs_changed_since"])
        html += (f"<p>{badge('WARN')} written {e(cmp['written_at'])}; runs changed since: "
                 f'{changed}. Run <code class="cmd">{e(d["commands"]["compare"])}</code> '
                 "again.</p>")  # fmt: skip
    html += "<h3>Per variant, over every seed (V6)</h3>" + table(
        ["variant", "seeds used", *(f"{e(k)} mean ± std" for k in keys), f"{e(keys[0])} per seed",
         f"Δ vs control [{e(_level(cmp))} CI]", "guards"],
        [_variant_row(v, keys, colours.get(v["name"], "#999")) for v in variants])  # fmt: skip
    html += "<h3>Bootstrap interval of the difference to the control</h3>"
    html += _intervals(d, cmp, colours) + "<h3>Guards (H2)</h3>"
    grows = [(v["name"], g) for v in variants for g in v.get("guards") or []]
    html += table(["variant", "guard", "verdict", "what was seen"],
                  [[e(n), e(g.get("check")), badge(g.get("verdict")), prose(g.get("sentence"))]
                   for n, g in grows], "",
                  [ROW_CLASS.get(str(g.get("verdict")), "") for _, g in grows]) if grows else (
        "<p>No guard was judged (no completed run).</p>")  # fmt: skip
    blocked = [(v["name"], b) for v in variants for b in v.get("blocked") or []]
    if blocked:
        items = "".join(f"<li>{code(n)}: {e(b)}</li>" for n, b in blocked)
        html += f"<h3>Why a variant cannot be adopted</h3><ul>{items}</ul>"
    out = [r for v in variants for r in v.get("runs") or [] if r.get("excluded")]
    html += "<h3>Runs not in the numbers, with their reasons (V3)</h3>"
    html += table(["run", "variant", "seed", "status", "why"],
                  [[code(r.get("run_id")), e(r.get("variant")), num(r.get("seed")),
                    badge(r.get("status")), e(r.get("excluded"))] for r in out]) if out else (
        "<p>Every run is in the numbers.</p>")  # fmt: skip
    notes = "".join(f"<li>{e(n)}</li>" for n in cmp.get("notes") or [])
    html += f"<ul>{notes}</ul>" if notes else ""
    ref = cmp.get("reference") or {}
    return html + dl([("reference control run", code(ref.get("run"))),
                      ("eval config", code(ref.get("eval_config_hash"))),
                      ("data version", code(ref.get("data_version"))),
                      ("written", e(cmp.get("written_at")))]) + decision_history(d)  # fmt: skip


def decision_history(d: dict[str, Any]) -> str:
    """Every decision `compare` reached, from the ledger, newest first (L4): comparison.json
    holds only the latest."""
    decisions = d.get("decisions") or []
    if not decisions:
        return ""
    shown = (cmp := d["comparison"] or {}).get("decision_record") or {}
    rows = [[num(x["id"]) + (" (comparison.json)" if x["id"] == shown.get("id") else ""),
             e(x["at"][:19]), code(x["adopted"]) if x["adopted"] else "keep the control",
             code(x["evidence_sha256"][:16]), prose(x["decision"])]
            for x in reversed(decisions)]  # fmt: skip
    latest = decisions[-1]["id"]
    stale = (f"<p>{badge('WARN')} comparison.json shows decision #{num(shown.get('id'))}, not the "
             f"latest (#{num(latest)}).</p>" if shown and shown.get("id") != latest and cmp
             else "")  # fmt: skip
    return ("<h3>Every decision, with its evidence (L4)</h3><p>Kept in the ledger with the "
            "digest of the evaluations it rests on; a decision is added when the evidence or "
            "the conclusion changes, and none is ever replaced.</p>" + stale
            + table(["#", "at", "decision", "evidence sha256", "why"], rows, "decisions"))


def _level(cmp: dict[str, Any]) -> str:
    for v in cmp.get("variants") or []:
        if isinstance(v.get("ci"), dict):
            return f"{v['ci'].get('level', 0.95):.0%}"
    return "95%"


def per_class(d: dict[str, Any]) -> str:
    pc = d["per_class"]
    series = pc["series"]
    what = "class" if pc["block"] == "per_class" else "field"
    if not series:
        return missing(f"no per-{what} scores: neither a baseline nor a compared run",
                       d["commands"]["baseline"])  # fmt: skip
    colours = run_colours(d)
    colour = {"baseline": charts.BASELINE_COLOUR}
    # A class without a validation example has no score: its 0.00 would read as a failure.
    empty = {k for k, v in pc["support"].items() if v == 0}
    bars = [charts.Bars(f"{s['name']} ({s['role']})" if s["name"] != s["role"] else s["name"],
                        colour.get(s["role"], colours.get(s["name"], "#999")),
                        {k: v for k, v in s["values"].items()
                         if isinstance(v, int | float) and k not in empty})
            for s in series]  # fmt: skip
    cats = list(dict.fromkeys(k for s in series for k in s["values"]))
    notes = {k: f"(n={v})" for k, v in pc["support"].items() if v is not None}
    html = (f"<p>{e(pc['metric'])} per {what} on validation: the starting model, the control and "
            "the best variant (the adopted one, else the largest difference to the control), "
            "each averaged over its compared seeds. n is the "
            f"{what}'s support in the baseline evaluation.</p>")  # fmt: skip
    html += charts.legend([(b.name, b.colour, "box") for b in bars])
    html += charts.bar_chart(
        cats,
        bars,
        title=f"{pc['metric']} per {what}",
        metric=f"{pc['metric']} per {what}",
        notes=notes,
    )
    if len(series) < 3:
        html += (
            "<p>"
            + e("Only " + ", ".join(s["name"] for s in series) + " shown: ")
            + ("the other series need a baseline evaluation and a comparison with a variant.</p>")
        )
    return html


def test_looks(d: dict[str, Any]) -> str:
    t = d["test_looks"]
    html = dl([("looks", f"<strong>{t['count']}</strong>"),
               ("policy on a second look", e(t.get("policy") or "–"))])  # fmt: skip
    if not t["looks"]:
        return html + missing("the sealed test split was never looked at (H4): look once, at the "
                              "run you chose", d["commands"]["test"])  # fmt: skip
    keys = headlines(d)
    return html + table(["look", "run", "at", "eval config", *keys],
                        [[num(x["number"]), code(x["run_id"]), e(x["at"][:19]),
                          code(x["config_hash"]),
                          *(num((x.get("metrics") or {}).get(k)) for k in keys)]
                         for x in t["looks"]], "",
                        ["" if x["number"] == 1 else "r-warn" for x in t["looks"]])  # fmt: skip


def notebook(d: dict[str, Any]) -> str:
    notes = d["notes"]
    if not notes:
        return missing("no notebook entry: decisions and observations were not written down (L4)",
                       d["commands"]["note"])  # fmt: skip
    return table(["#", "at", "run", "entry"],
                 [[num(n["id"]), e(n["at"][:19]), code(n["run_id"]) if n["run_id"] else "–",
                   f'<div class="note-text">{e(n["text"])}</div>'] for n in notes],
                 "notes")  # fmt: skip


def exports(d: dict[str, Any]) -> str:
    items = d["exports"]
    if not items:
        return missing("no bundle under exports/: nothing is ready to deliver (R3)",
                       d["commands"]["export"])  # fmt: skip
    rows = []
    for x in items:
        check = x.get("verification")
        base = x.get("base") or {}
        revision = base.get("resolved_commit") or base.get("revision")
        rows.append([code(x["name"]), code(x["run_id"]), badge(x.get("run_status")),
                     e(f"{x.get('weights')} ({x.get('method')})"),
                     f"{num(x['n_files'])} files, {x['bytes'] / 2**20:.2f} MiB",
                     e(f"{base.get('name')} @ {revision or 'local'}"),
                     code(x.get("data_version")),
                     (badge(check.get("verdict")) + f" {e((check.get('at') or '')[:19])}") if check
                     else f"{badge('WARN')} not verified"])  # fmt: skip
    html = table(["bundle", "run", "run status", "weights", "files (MANIFEST.json)", "base (P4)",
                  "data version", "reload check (R2)"], rows)  # fmt: skip
    for x in items:
        check = x.get("verification")
        html += f"<h3>Reload check of {code(x['name'])}</h3>"
        if x.get("pin"):  # the MANIFEST is unauthenticated: its digest is what a reader pins
            pin = f"tunepilot verify {x['folder']} --expect {x['pin']}"
            html += f"<p>Pin it: <code>{e(pin)}</code></p>"
        if not check:
            html += missing("this bundle was never verified", f"tunepilot verify {x['folder']}")
            continue
        findings = check.get("findings") or []
        html += table(["check", "verdict", "what was seen", "req"],
                      [[e(f.get("check")), badge(f.get("verdict")), e(f.get("sentence")),
                        e(f.get("requirement"))] for f in findings], "",
                      [ROW_CLASS.get(str(f.get("verdict")), "") for f in findings])  # fmt: skip
    return html


def limits(d: dict[str, Any]) -> str:
    items = d["limits"]
    intro = (
        "<p>What the evidence in this folder says the result cannot claim, derived from the "
        "sections above (L5): read these before quoting any number.</p>"
    )
    if not items:
        return intro + "<p>No limit was observed in the recorded evidence.</p>"
    return intro + table(["", "area", "limit", "req"],
                         [[badge(x["severity"]), e(x["area"]), prose(x["sentence"]),
                           e(x["requirement"])] for x in items], "limits",
                         [ROW_CLASS.get(x["severity"], "") for x in items])  # fmt: skip
