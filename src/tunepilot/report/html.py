"""The dossier as ONE self-contained HTML file: inline CSS and SVG, no script, no address (L4).

`render(d)` turns the dict from `collect.collect` into the page. Every string that came from a
user or a file (hypothesis, class names, run ids, reasons, notes, sentences) passes through
`e()` (html.escape) before it reaches the page; only markup written here is left unescaped.
Every section is present even when empty: it then says what is missing and which command
fills it, so an absent pilot or export is visible rather than silently left out.
"""

from __future__ import annotations

from typing import Any

from tunepilot.report import results as r
from tunepilot.report import sections as s
from tunepilot.report.elements import e
from tunepilot.report.examples import examples_section
from tunepilot.report.glossary import glossary_section, link_ids

CSS = """
:root{--ink:#1f2937;--muted:#6b7280;--line:#e5e7eb;--bg:#f6f7f9;--card:#fff;--accent:#2563eb;
--pass:#166534;--pass-bg:#dcfce7;--warn:#92400e;--warn-bg:#fef3c7;--fail:#991b1b;--fail-bg:#fee2e2;
--info:#1e40af;--info-bg:#dbeafe}
*{box-sizing:border-box}
html{scroll-behavior:smooth}
body{margin:0;background:var(--bg);color:var(--ink);font:15px/1.55 Inter,"Segoe UI",Roboto,
Helvetica,Arial,sans-serif;-webkit-font-smoothing:antialiased}
.wrap{max-width:1180px;margin:0 auto;padding:0 28px}
header.top{background:#0f172a;color:#e2e8f0;padding:30px 0 22px;margin-bottom:26px}
header.top h1{margin:2px 0 6px;font-size:30px;color:#fff;letter-spacing:-.01em}
header.top code{background:#1e293b;color:#e2e8f0}
.kicker{margin:0;text-transform:uppercase;letter-spacing:.12em;font-size:12px;color:#93c5fd}
.behaviour{font-size:17px;margin:0 0 8px;color:#f1f5f9}
.facts{margin:2px 0;font-size:13px;color:#94a3b8}
nav#contents{background:var(--card);border:1px solid var(--line);border-radius:10px;
padding:14px 22px;margin-bottom:22px}
nav#contents h2{font-size:14px;margin:0 0 6px;text-transform:uppercase;letter-spacing:.08em;
color:var(--muted)}
nav#contents ol{columns:3;margin:0;padding-left:22px;font-size:14px}
nav#contents a{color:var(--accent);text-decoration:none}
nav#contents a:hover{text-decoration:underline}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;
padding:18px 24px 20px;margin-bottom:22px}
section h2{margin:0 0 12px;font-size:21px;display:flex;align-items:center;gap:10px}
section h2 .n{display:inline-flex;width:28px;height:28px;border-radius:50%;background:#eef2ff;
color:var(--accent);font-size:14px;align-items:center;justify-content:center}
h3{font-size:16px;margin:18px 0 8px}
h4,h5,h6{font-size:14px;margin:14px 0 6px}
p{margin:6px 0}
code{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#f3f4f6;
padding:1px 5px;border-radius:4px}
code.cmd{background:#0f172a;color:#e2e8f0}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:13.5px;margin:8px 0 12px}
th{text-align:left;font-weight:600;color:#374151;background:#f9fafb;border-bottom:2px solid
var(--line);padding:7px 9px;white-space:nowrap}
td{border-bottom:1px solid var(--line);padding:6px 9px;vertical-align:top}
tbody tr:nth-child(even) td{background:#fcfcfd}
table.compact{width:auto;min-width:280px}
tr.r-fail td{background:#fff5f5!important}tr.r-warn td{background:#fffbeb!important}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.badge{display:inline-block;padding:1px 8px;border-radius:999px;font-size:11.5px;font-weight:700;
letter-spacing:.03em;white-space:nowrap;background:#f3f4f6;color:#374151}
.b-pass,.b-completed{background:var(--pass-bg);color:var(--pass)}
.b-warn,.b-interrupted,.b-running,.b-planned{background:var(--warn-bg);color:var(--warn)}
.b-fail,.b-diverged,.b-failed{background:var(--fail-bg);color:var(--fail)}
.b-info{background:var(--info-bg);color:var(--info)}
.b-invalid{background:#e5e7eb;color:#374151;text-decoration:line-through}
.missing{background:#f8fafc;border:1px dashed #cbd5e1;border-radius:8px;padding:10px 14px;
color:#475569}
.callout{border-radius:10px;padding:14px 18px;margin:10px 0 14px;font-size:15.5px;border:1px solid}
.callout.adopt{background:#f0fdf4;border-color:#86efac}
.callout.keep{background:#fffbeb;border-color:#fcd34d}
.callout.none{background:#fef2f2;border-color:#fca5a5}
.callout .label{display:block;font-size:12px;text-transform:uppercase;letter-spacing:.08em;
color:var(--muted);margin-bottom:4px}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(150px,1fr));gap:12px;
margin:12px 0}
.tile .sub{font-size:12.5px;color:var(--muted);margin-top:2px}
.tile .mono{font:600 13px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;word-break:break-all}
.tile{border:1px solid var(--line);border-radius:8px;padding:10px 14px;background:#fafafa}
.tile .k{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.06em}
.tile .v{font-size:19px;font-weight:650;margin-top:2px}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:8px 0;font-size:14px}
dl.kv dt{color:var(--muted)}dl.kv dd{margin:0}
.side{display:grid;grid-template-columns:repeat(auto-fit,minmax(300px,1fr));gap:14px}
.card{border:1px solid var(--line);border-radius:8px;padding:10px 14px;min-width:0}
table.hyp{table-layout:fixed}table.hyp td:first-child{width:46%;word-break:break-word}
table.hyp td code{white-space:normal;word-break:break-word}
.card h4{margin:0 0 6px}
.changed{background:#fef9c3}
.note-text{white-space:pre-wrap}
.legend{display:flex;flex-wrap:wrap;gap:6px 16px;font-size:13px;margin:4px 0 10px}
.legend-item{display:inline-flex;align-items:center;gap:6px}
.swatch{display:inline-block;width:14px;height:10px;border-radius:2px}
svg.chart{max-width:100%;height:auto;display:block;margin:6px 0}
.grid-runs svg.chart{width:100%}
.pair{display:grid;grid-template-columns:repeat(auto-fit,minmax(440px,1fr));gap:8px 24px}
.pair svg.chart{width:100%}
td code,td.nowrap,td .nowrap{white-space:nowrap}
.muted{color:var(--muted)}
svg .grid{stroke:#eceef1;stroke-width:1}svg .axis{stroke:#9ca3af;stroke-width:1}
svg .zero{stroke:#111827;stroke-width:1.5;stroke-dasharray:5 4}
svg text{fill:#374151}svg .tick{font-size:11px;fill:#6b7280}svg .label{font-size:12px}
svg .name{font-size:12.5px}svg .value{font-size:12px}svg .value.good{fill:#166534;font-weight:700}
svg .small{font-size:10px;fill:#4b5563}
.grid-runs{display:grid;grid-template-columns:repeat(auto-fill,minmax(260px,1fr));gap:12px}
.grid-runs .card svg.chart{margin:0}
.grid-runs .card p{font-size:12.5px;margin:2px 0}
.md table{font-size:13px}.md h3{margin-top:14px}
details summary{cursor:pointer;color:var(--accent);font-size:13.5px}
a.req{color:inherit;text-decoration:underline dotted #9ca3af;text-underline-offset:2px}
dl.glossary{grid-template-columns:3em 1fr 3em 1fr;font-size:13.5px}
dl.glossary dt{font-weight:650;color:var(--ink)}
table.runs div.reason{min-width:14em;max-width:26em}table.runs{font-size:12.5px}
table.confusion{width:auto}table.confusion td{text-align:right;min-width:3.2em}
table.confusion td.diag{font-weight:700}
table.heatmap{width:auto;border-collapse:collapse;table-layout:fixed;font-size:8px;margin:0;
line-height:1}
table.heatmap td{width:9px;height:9px;padding:0;border:1px solid #f3f4f6}
table.heatmap thead th{width:9px;padding:0;font-weight:400;color:var(--muted);
writing-mode:vertical-rl;text-align:left}
table.heatmap tbody th{font-size:10.5px;font-weight:400;padding:0 6px 0 0;white-space:nowrap;
text-align:left}
table.changed span.text{display:block;min-width:18em;max-width:40em}
footer{color:var(--muted);font-size:12.5px;padding-bottom:40px}
@media print{body{background:#fff}section{break-inside:avoid-page;border:none}
nav#contents{display:none}}
"""


SECTIONS = (
    ("summary", "Summary"),
    ("hypothesis", "Hypothesis and guards"),
    ("data", "Data and audit"),
    ("pilot", "Pilot: gates, sizing, rental plan"),
    ("baseline", "Baseline"),
    ("runs", "Runs"),
    ("curves", "Loss curves and validation points"),
    ("comparison", "Comparison and decision"),
    ("per-class", "Per class (per field) against the baseline"),
    ("examples", "Examples fixed and broken against the baseline"),
    ("test", "Sealed test looks"),
    ("notebook", "Notebook"),
    ("exports", "Exports and verification"),
    ("limits", "Observed limits"),
    ("glossary", "Requirement ids"),
)


# --------------------------------------------------------------------------------------------


def render(d: dict[str, Any]) -> str:
    t = d["title"]
    bodies = {
        "summary": s.summary(d), "hypothesis": s.hypothesis(d), "data": s.data(d),
        "pilot": s.pilot(d), "baseline": s.baseline(d), "runs": s.runs(d),
        "curves": r.curves(d), "comparison": r.comparison(d), "per-class": r.per_class(d),
        "examples": examples_section(d),
        "test": r.test_looks(d), "notebook": r.notebook(d), "exports": r.exports(d),
        "limits": r.limits(d),
    }  # fmt: skip
    toc = "".join(f'<li><a href="#{sid}">{e(title)}</a></li>' for sid, title in SECTIONS)
    parts = [
        f'<section id="{sid}"><h2><span class="n">{i}</span>{e(title)}</h2>{bodies[sid]}</section>'
        for i, (sid, title) in enumerate(SECTIONS) if sid != "glossary"
    ]
    linked, used = link_ids("".join(parts))  # every cited id links to its glossary line
    glossary = f'<section id="glossary"><h2><span class="n">{len(parts)}</span>' + e(
        SECTIONS[-1][1]) + f"</h2>{glossary_section(used)}</section>"  # fmt: skip
    facts = " · ".join([
        f"generated {e(t['generated_at'])}", f"tunepilot {e(t['tunepilot_version'])}",
        f"config hash <code>{e(t['config_hash'])}</code>", f"task {e(t['task'])}",
        f"model <code>{e(t['model'])}</code> ({e(t['method'])})",
    ])  # fmt: skip
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="tunepilot {e(t["tunepilot_version"])}">
<title>{e(t["campaign"])}: campaign dossier</title>
<style>{CSS}</style></head>
<body><header class="top"><div class="wrap">
<p class="kicker">tunepilot campaign dossier</p>
<h1>{e(t["campaign"])}</h1>
<p class="behaviour">{e(t["behaviour"])}</p>
<p class="facts">{facts}</p>
<p class="facts">folder <code>{e(t["folder"])}</code>; commands below run from this folder.</p>
</div></header>
<main class="wrap">
<nav id="contents" aria-label="Contents"><h2>Contents</h2><ol start="0">{toc}</ol></nav>
{linked}{glossary}
</main>
<footer class="wrap">Written by <code>tunepilot report</code> from the campaign folder; one file,
no script, no network. Requirement ids (H1, V3, L5 …) refer to the tunepilot specification.
</footer></body></html>
"""
