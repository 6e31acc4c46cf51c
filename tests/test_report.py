"""The dossier (L4, L5) written from a real campaign folder: a tiny model, real runs (one variant
forced to diverge, and a retry of it), a baseline, a comparison, notes, an amended hypothesis
and two looks at the sealed test split, all through the ordinary command bodies.

The browser half (headless Chromium, the pilot and the export) is in test_report_browser.py.
"""

from __future__ import annotations

import html as html_lib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tunepilot.data.workspace import Workspace
from tunepilot.report.flow import report_command, write_report
from tunepilot.report.html import SECTIONS

torch = pytest.importorskip("torch")

NOTE = "<b>note</b> & lr 2e-4 diverges at once; keep 1e-4"
AMEND_REASON = "<i>support</i> asked for a looser drop"
OVERRIDES = {
    "data.fields.time": None,
    "training.budget.updates": 6,
    "training.eval_every": 3,
    "training.accumulation": 2,
    "training.warmup_updates": 0,
    "training.lr": 1e-3,
    "seeds": [0, 1],
    # the second variant stops at its first update: a diverged run that keeps its line (V3)
    "variants.lr-2e-4.overrides": {"training.lr": 2e-4, "training.stop.max_loss": 1e-3},
}


def build_campaign(folder: Path, *, full: bool = False) -> Workspace:
    """audit -> baseline -> every variant x seed -> a retry -> note -> compare -> two test looks
    (-> pilot -> export -> verify when `full`), as a user would run them."""
    from tunepilot.data.flow import audit_workspace
    from tunepilot.demo.campaign import write_demo_campaign
    from tunepilot.experiments import flow as run_flow
    from tunepilot.experiments.compare import compare_command
    from tunepilot.experiments.runner import Session, execute_run
    from tunepilot.experiments.sealed_test import final_test
    from tunepilot.ledger import Ledger

    path = write_demo_campaign(
        folder, "classification", tiny=True, n_conversations=40, overrides=OVERRIDES
    )
    ws = Workspace.open(path)
    audit_workspace(ws, as_json=False)
    run_flow.baseline(ws, as_json=False)
    run_flow.run(ws, None, None, None, as_json=False)
    with Ledger.open(ws.ledger_path) as ledger:
        execute_run(Session(ws), ledger, "lr-2e-4", 0, retry_of="lr-2e-4-s0-1")
    # the user edits a guard after the first runs: allowed, as an amendment with its reason
    text = path.read_text()
    assert "max_class_drop: 0.05" in text
    path.write_text(text.replace("max_class_drop: 0.05", "max_class_drop: 0.1"))
    ws = Workspace.open(path)
    run_flow.amend(ws, AMEND_REASON)
    run_flow.note(ws, NOTE, "lr-2e-4-s0-1")
    compare_command(ws, as_json=False)
    final_test(ws, "control-s0-1", as_json=False)
    final_test(ws, "control-s1-1", as_json=False)  # a second look: H4 warns, the dossier too
    if full:
        from tunepilot.deliver.flow import export_command
        from tunepilot.deliver.verify import verify_command
        from tunepilot.pilot.flow import run_pilot

        run_pilot(ws, as_json=False)
        export_command(ws, "control-s0-1", None, False)
        verify_command(ws.exports_dir / "control-s0-1", False)
    return ws


@pytest.fixture(scope="module")
def dossier(tmp_path_factory: pytest.TempPathFactory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ws = build_campaign(tmp_path_factory.mktemp("report"))
    finally:
        torch.set_num_threads(before)
    path, data = write_report(ws)
    return ws, path.read_text(encoding="utf-8"), data


def test_l4_report_command_writes_index_html_and_prints_its_path(dossier, capsys) -> None:
    ws, _, _ = dossier
    assert report_command(ws, open_browser=False, as_json=False) == 0
    out = capsys.readouterr().out
    assert str(ws.report_dir / "index.html") in out.replace("\n", "")
    assert (ws.report_dir / "index.html").is_file()


def test_l4_every_section_is_present_with_its_anchor_in_the_contents(dossier) -> None:
    _, html, _ = dossier
    for sid, title in SECTIONS:
        assert f'<section id="{sid}">' in html, sid
        assert f'href="#{sid}"' in html, sid
        assert title.replace("&", "&amp;") in html, title
    assert html.count("<section ") == len(SECTIONS) == 15


def test_v3_every_run_is_listed_with_status_reason_and_retry(dossier) -> None:
    from tunepilot.ledger import Ledger

    ws, html, data = dossier
    with Ledger.open(ws.ledger_path) as ledger:
        runs = ledger.list_runs()
    assert len(runs) == 7 and len(data["runs"]) == 7
    runs_section = html.split('<section id="runs">')[1].split("</section>")[0]
    for r in runs:
        assert f"<code>{r.id}</code>" in runs_section, r.id
    diverged = [r for r in runs if r.status == "diverged"]
    assert {r.id for r in diverged} == {"lr-2e-4-s0-1", "lr-2e-4-s1-1", "lr-2e-4-s0-2"}
    for r in diverged:
        assert "stop.max_loss" in r.reason
        assert r.reason.replace(">", "&gt;") in runs_section
    assert "retry of <code>lr-2e-4-s0-1</code>" in runs_section
    assert "retried by <code>lr-2e-4-s0-2</code>" in runs_section
    assert runs_section.count('class="r-fail"') == 3  # diverged rows are tinted


def test_v5_loss_curves_validation_points_intervals_and_per_class_are_inline_svg(dossier) -> None:
    _, html, data = dossier
    curves = html.split('<section id="curves">')[1].split("</section>")[0]
    # one combined loss chart, two validation charts (macro_f1, accuracy), one per run
    assert curves.count('<svg class="chart line-chart"') == 1 + 2 + len(data["runs"])
    assert curves.count('class="end-diverged"') == 2 * 3  # combined + own chart, 3 diverged
    assert "<polyline" in curves and 'class="point"' in curves  # lines and validation points
    assert "lr-2e-4" in curves and "seed 1" in curves  # legend: colour per variant, dash per seed
    cmp = html.split('<section id="comparison">')[1].split("</section>")[0]
    assert cmp.count('<svg class="chart interval-chart"') == 1 and 'class="zero"' in cmp
    per_class = html.split('<section id="per-class">')[1].split("</section>")[0]
    assert per_class.count('<svg class="chart bar-chart"') == 1
    names = {s["role"] for s in data["per_class"]["series"]}
    assert names == {"baseline", "control", "best variant"}
    for label in data["per_class"]["series"][0]["values"]:
        assert label in per_class


def test_v7_decision_is_shown_prominently_with_guards_and_excluded_runs(dossier) -> None:
    ws, html, data = dossier
    cmp = json.loads((ws.root / "comparison.json").read_text(encoding="utf-8"))
    summary = html.split('<section id="summary">')[1].split("</section>")[0]
    callout = summary.split('<div class="callout')[1].split("</div>")[0]
    shown = html_lib.unescape(re.sub(r"<[^>]+>", "", callout.split("</span>", 1)[1]))
    assert shown == cmp["decision"].replace("`", "")  # `x` is rendered as <code>x</code>
    section = html.split('<section id="comparison">')[1].split("</section>")[0]
    assert "Runs not in the numbers" in section and "lr-2e-4-s1-1" in section
    assert "guard: class drop vs baseline" in section


def test_l4_user_strings_are_escaped(dossier) -> None:
    _, html, _ = dossier
    assert "<b>note</b>" not in html and "<i>support</i>" not in html
    assert "&lt;b&gt;note&lt;/b&gt; &amp; lr 2e-4 diverges at once" in html
    assert "&lt;i&gt;support&lt;/i&gt; asked for a looser drop" in html


def test_l4_the_file_is_self_contained(dossier) -> None:
    _, html, _ = dossier
    lowered = html.lower()
    for bad in ("http://", "https://", "<script", "<link", "<img", "@import", "url(", "src="):
        assert bad not in lowered, bad
    assert "<style>" in html and lowered.startswith("<!doctype html>")


def test_h1_original_and_amended_hypothesis_are_side_by_side_with_the_reason(dossier) -> None:
    _, html, data = dossier
    history = data["hypothesis"]["history"]
    assert [h["kind"] for h in history] == ["original", "amendment"]
    section = html.split('<section id="hypothesis">')[1].split("</section>")[0]
    assert section.count('<div class="card">') == 2
    assert '<tr class="changed"><td>classification_guards.max_class_drop</td>' in section
    assert any("the hypothesis was amended 1" in x["sentence"] for x in data["limits"])


def test_h4_test_looks_are_counted_and_a_second_look_is_a_limit(dossier) -> None:
    _, html, data = dossier
    assert data["test_looks"]["count"] == 2
    section = html.split('<section id="test">')[1].split("</section>")[0]
    assert "control-s0-1" in section and "control-s1-1" in section
    assert any(
        x["area"] == "sealed test" and "looked at 2 times" in x["sentence"] for x in data["limits"]
    )


def test_l5_limits_are_derived_from_the_evidence(dossier) -> None:
    _, html, data = dossier
    by_area: dict[str, list[str]] = {}
    for x in data["limits"]:
        by_area.setdefault(x["area"], []).append(x["sentence"])
    assert any("3 run(s) diverged" in s for s in by_area["runs"])
    assert any("class balance" in s or "truncation" in s for s in by_area["data"])  # audit WARNs
    assert any("no pilot" in s for s in by_area["pilot"])
    assert any("nothing exported" in s for s in by_area["delivery"])
    assert any("14 examples" in s for s in by_area["data"])  # the validation grain
    order = [x["severity"] for x in data["limits"]]
    assert order == sorted(order, key=["FAIL", "WARN", "INFO"].index)
    section = html.split('<section id="limits">')[1].split("</section>")[0]
    assert section.count("<tr class=") == len(data["limits"])


def test_l4_missing_sections_name_the_command_that_fills_them(dossier) -> None:
    _, html, _ = dossier
    pilot = html.split('<section id="pilot">')[1].split("</section>")[0]
    assert "Missing:" in pilot and "tunepilot pilot campaign.yaml" in pilot
    exports = html.split('<section id="exports">')[1].split("</section>")[0]
    assert "Missing:" in exports and "tunepilot export RUN campaign.yaml" in exports


def test_l4_json_prints_the_collected_dict_as_strict_json(dossier, capsys) -> None:
    ws, _, _ = dossier
    assert report_command(ws, open_browser=False, as_json=True) == 0
    out = capsys.readouterr().out

    def no_nan(name: str) -> None:
        raise AssertionError(f"{name} in the JSON")

    data = json.loads(out, parse_constant=no_nan)
    assert data["report_path"] == str(ws.report_dir / "index.html")
    assert {
        "title",
        "hypothesis",
        "data",
        "pilot",
        "baseline",
        "runs",
        "comparison",
        "per_class",
        "test_looks",
        "notes",
        "exports",
        "limits",
    } <= set(data)
    assert data["title"]["config_hash"] == ws.campaign.config_hash()
    assert data["data"]["splits"]["counts"]["validation"] == 14
    assert data["notes"][0]["text"] == NOTE


def test_l4_open_hands_the_file_uri_to_the_system_browser(dossier, tmp_path: Path) -> None:
    """`--open` goes through the webbrowser module; $BROWSER points it at a script here."""
    ws, _, _ = dossier
    seen = tmp_path / "opened.txt"
    script = tmp_path / "browser.sh"
    script.write_text(f'#!/bin/sh\necho "$1" > {seen}\n', encoding="utf-8")
    script.chmod(0o755)
    code = (
        "import sys; from tunepilot.data.workspace import Workspace; "
        "from tunepilot.report.flow import report_command; "
        "sys.exit(report_command(Workspace.open(sys.argv[1]), True, False))"
    )
    env = {**os.environ, "BROWSER": str(script)}
    done = subprocess.run(
        [sys.executable, "-c", code, str(ws.campaign_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert seen.read_text(encoding="utf-8").strip() == (ws.report_dir / "index.html").as_uri()


def test_l4_an_empty_campaign_folder_gives_a_dossier_that_says_what_is_missing(
    tmp_path: Path,
) -> None:
    from tunepilot.demo.campaign import write_demo_campaign

    ws = Workspace.open(
        write_demo_campaign(tmp_path, "classification", tiny=True, n_conversations=20)
    )
    path, data = write_report(ws)
    html = path.read_text(encoding="utf-8")
    assert not ws.ledger_path.exists()  # the report reads; it never creates a ledger
    for sid, _ in SECTIONS:
        assert f'<section id="{sid}">' in html
    assert html.count('class="missing"') >= 10
    for command in (
        "tunepilot baseline campaign.yaml",
        "tunepilot data audit campaign.yaml",
        "tunepilot run campaign.yaml",
        "tunepilot compare campaign.yaml",
    ):
        assert command in html
    assert data["runs"] == [] and data["comparison"] is None


def test_s5_cuda_gate_rows_keep_allocated_and_reserved_in_separate_columns_with_a_fake_cuda() -> (
    None
):
    """A fake `torch.cuda` (CUDA-only counters; no GPU here) feeds the real memory probe; the
    gate table shows allocated and reserved side by side and never their sum (S5)."""
    from tunepilot.measure.memory import MemoryProbe
    from tunepilot.report.sections import gate_table

    mib = 2**20

    class FakeCuda:
        def __init__(self) -> None:
            self.alloc, self.res = 10 * mib, 12 * mib
            self.max_alloc, self.max_res = self.alloc, self.res

        def device_count(self) -> int:
            return 1

        def synchronize(self, device: int) -> None: ...

        def reset_peak_memory_stats(self, device: int) -> None:
            self.max_alloc, self.max_res = self.alloc, self.res

        def memory_allocated(self, device: int) -> int:
            return self.alloc

        def memory_reserved(self, device: int) -> int:
            return self.res

        def max_memory_allocated(self, device: int) -> int:
            return self.max_alloc

        def max_memory_reserved(self, device: int) -> int:
            return self.max_res

    cuda = FakeCuda()
    probe = MemoryProbe.for_device("cuda", cuda_api=cuda)
    with probe.phase("first step") as record:
        cuda.max_alloc, cuda.max_res = 110 * mib, 128 * mib
    row = {
        "number": 6,
        "phase": "first step",
        "inputs": {"microbatch": 2, "length": 64},
        "memory": record.to_json(),
        "duration_s": 0.5,
        "verdict": "PASS",
        "sentence": "ok",
        "requirement": "S1",
    }
    html = gate_table([row])
    head = re.findall(r"<th>(.*?)</th>", html)
    assert "allocated peak (+phase)" in head and "reserved peak (+phase)" in head
    cells = re.findall(r"<td>(.*?)</td>", html)
    alloc = cells[head.index("allocated peak (+phase)")]
    reserved = cells[head.index("reserved peak (+phase)")]
    assert "110.00 MiB" in alloc and "+100.00 MiB" in alloc
    assert "128.00 MiB" in reserved and "+116.00 MiB" in reserved
    assert "238.00 MiB" not in html  # never summed


# --------------------------------------------------------------------------------------------
# a report people read (H2, H3, V5, L4)
# --------------------------------------------------------------------------------------------


def _section(html: str, sid: str) -> str:
    return html.split(f'<section id="{sid}">')[1].split("</section>")[0]


def test_l4_every_cited_requirement_id_links_to_its_glossary_line(dossier) -> None:
    from tunepilot.report.glossary import GLOSSARY

    _, html, _ = dossier
    linked = set(re.findall(r'<a class="req" href="#req-([A-Z][0-9])"', html))
    glossary = _section(html, "glossary")
    listed = set(re.findall(r'<dt id="req-([A-Z][0-9])">', glossary))
    assert {"H3", "V3", "V5", "L5"} <= linked and linked == listed
    for rid in listed:
        assert GLOSSARY[rid] in glossary
    assert 'href="#req-V3"' in _section(html, "runs")  # "failures included (V3)"
    assert "<svg" not in glossary and 'href="#req-' not in re.sub(r"<svg.*?</svg>", "", glossary)


def test_v5_the_loss_chart_draws_a_smoothed_line_over_the_raw_one(dossier) -> None:
    from tunepilot.report.charts import smoothed

    _, html, data = dossier
    curves = _section(html, "curves")
    combined = curves.split('<svg class="chart line-chart"')[1].split("</svg>")[0]
    with_curve = [r for r in data["runs"] if len(r["curve"]) > 1]
    assert combined.count('class="line raw"') == len(with_curve)
    assert combined.count('class="line"') == len(with_curve)
    assert "Solid: smoothed" in curves
    assert smoothed([(1, 2.0), (2, 2.0), (3, 2.0)], 0.6) == [(1, 2.0), (2, 2.0), (3, 2.0)]
    ema = smoothed([(1, 4.0), (2, None), (3, 0.0)], 0.5)
    assert ema[0] == (1, 4.0) and ema[1] == (2, None) and ema[2] == (3, pytest.approx(4 / 3))


def test_h3_confusion_matrix_and_fixed_broken_examples_come_from_the_ledger(
    dossier,
) -> None:
    from tunepilot.ledger import BASELINE, Ledger

    ws, html, data = dossier
    x = data["examples"]
    assert x["run"] == "control-s0-1"  # nothing adopted: the control's first seed
    with Ledger.open(ws.ledger_path) as ledger:
        def correct(run_id: str) -> dict[str, bool]:
            ev = [v for v in ledger.evaluations(run_id) if v.split == "validation"][-1]
            return {p.example_id: bool(p.score) for p in ledger.predictions(ev.id)}

        before, after = correct(BASELINE), correct("control-s0-1")
    assert [r["id"] for r in x["fixed"]] == sorted(i for i in after if after[i] and not before[i])
    assert [r["id"] for r in x["broke"]] == sorted(i for i in after if before[i] and not after[i])
    c = x["counts"]
    assert c["fixed"] + c["broke"] + c["both right"] + c["both wrong"] == len(after) == 14
    assert sum(map(sum, x["confusion"]["counts"])) == 14
    trace = sum(x["confusion"]["counts"][i][i] for i in range(len(x["confusion"]["labels"])))
    assert trace == sum(after.values())
    section = _section(html, "examples")
    assert section.count("<details>") == 2 and '<table class="confusion">' in section
    for r in x["fixed"] + x["broke"]:
        assert f"<code>{r['id']}</code>" in section and r["text"]


def test_h2_the_confusion_matrix_has_a_row_and_column_for_every_class(dossier) -> None:
    """A class with no validation example and no prediction is still a row (n=0) and a column,
    in the classes' id order: the matrix agrees with the per-class chart above it."""
    ws, html, data = dossier
    confusion = data["examples"]["confusion"]
    labels = ws.prepare(write=False, seal=False).label_names
    assert confusion["labels"] == labels and len(labels) == 6
    unseen = [c for i, c in enumerate(labels) if not sum(confusion["counts"][i])]
    assert unseen and all(f"{c} <span class='muted'>(n=0)</span>" in html for c in unseen)


def test_h2_a_class_without_validation_examples_shows_n0_not_a_zero_bar() -> None:
    from tunepilot.report.results import per_class

    d = {
        "per_class": {"block": "per_class", "metric": "f1", "support": {"refunds": 5, "rare": 0},
                      "series": [{"name": "baseline", "role": "baseline",
                                  "values": {"refunds": 0.5, "rare": 0.0}}]},
        "hypothesis": {"variants": []}, "runs": [], "commands": {"baseline": "tunepilot baseline"},
    }  # fmt: skip
    svg = per_class(d)
    assert "rare (n=0)" in svg and "no score: no example to measure it on" in svg
    assert "refunds: 0.500" in svg and "rare: 0.000" not in svg


def test_v1_runs_with_different_configs_are_told_apart() -> None:
    from tunepilot.report.sections import runs

    def run(run_id: str, variant: str, config: str, diff: dict) -> dict:
        return {"id": run_id, "variant": variant, "seed": 0, "status": "completed",
                "reason": "budget reached", "retry_of": None, "retried_by": [],
                "config_hash": config, "data_version": "d1", "diff": diff, "curve": [[6, 1.0]],
                "final": {"macro_f1": 0.5}, "created_at": "2026-12-01T07:00:00", "history": []}

    d = {"title": {"task": "classification"}, "environment": {"backends": []},
         "commands": {"run": "tunepilot run"},
         "runs": [run("control-s0-1", "control", "aaa", {}),
                  run("control-s0-2", "control", "bbb", {}),
                  run("lr-2e-4-s0-1", "lr-2e-4", "ccc", {"training.lr": [1e-4, 2e-4]})]}
    html = runs(d)
    assert html.count("cfg 1") == 1 and html.count("cfg 2") == 1 and "cfg 3" in html
    assert "training.lr 0.0001 → 0.0002" in html
    assert "Different configurations under one name:</strong> control ran" in html


def test_l4_markdown_goes_through_markdown_it_with_raw_html_escaped() -> None:
    from tunepilot.report.elements import markdown

    text = ("# Plan\n\n1. pilot\n2. sweep\n\n| card | days |\n|---|---|\n| <b>A100</b> | `3` |"
            "\n\n*careful* with <script>x</script>\n\n```\nkeep  spacing\n```\n")
    html = markdown(text)
    assert "<h3>Plan</h3>" in html and "<ol>" in html and "<em>careful</em>" in html
    assert '<table class="md">' in html and "&lt;b&gt;A100&lt;/b&gt;" in html
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<pre><code>keep  spacing\n</code></pre>" in html
