"""The dossier and `compare --json` at thousands of runs (L4, V3): a readable file whose size
is bounded by what it draws, not by how many runs the ledger holds.

At 5,000 runs the report took 36 CPU-s and wrote 14 MB of HTML (a row, a chart and a curve in
the combined chart for every run), and `compare --json` 7.8 s and 10 MB (every run's
per-class metrics). These tests check the structure at a scale that runs in a second, with the
full-run cap lowered; benchmarks/bench_scale.py times the 5,000-run case.
"""

from __future__ import annotations

import json
import re

import pytest

from scale_support import write_scale_campaign
from tunepilot.data.workspace import Workspace

VARIANTS, SEEDS = 4, 6  # 30 runs


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    from tunepilot.experiments.compare import compare_command

    path = write_scale_campaign(tmp_path_factory.mktemp("scale"), "minilm", VARIANTS, SEEDS)
    ws = Workspace.open(path)
    compare_command(ws, as_json=True)
    return ws


def test_l4_v3_above_the_cap_the_dossier_draws_the_chosen_variants_and_summarises_the_rest(
    scaled: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tunepilot.report import scale
    from tunepilot.report.flow import write_report

    monkeypatch.setattr(scale, "FULL_RUNS", 8)
    path, data = write_report(scaled)
    html = path.read_text(encoding="utf-8")
    cmp = json.loads((scaled.root / "comparison.json").read_text())
    chosen = {"control", cmp["adopted"] or scale.best_variant(cmp)}
    full = [r for r in data["runs"] if r["full"]]
    assert len(data["runs"]) == (1 + VARIANTS) * SEEDS  # every run is still collected (V3)
    assert len(full) == 8 and {r["variant"] for r in full} <= chosen
    runs_table = html.split('<table class="runs">')[1].split("</table>")[0]
    assert runs_table.count("<tr class=") == 8
    variants_table = html.split('<table class="variants">')[1].split("</table>")[0]
    assert variants_table.count("<tr class=") == 1 + VARIANTS  # one summary row per variant
    assert len(re.findall(r'<svg class="chart line-chart"', html)) == 3 + 8  # not one per run
    assert all(r["curve"] == [] for r in data["runs"] if not r["full"])


def test_l4_below_the_cap_every_run_is_shown_in_full(scaled: Workspace) -> None:
    from tunepilot.report.flow import write_report

    path, data = write_report(scaled)
    assert all(r["full"] for r in data["runs"])
    html = path.read_text(encoding="utf-8")
    assert '<table class="variants">' not in html
    runs_table = html.split('<table class="runs">')[1].split("</table>")[0]
    assert runs_table.count("<tr class=") == len(data["runs"])


def test_v3_compare_json_holds_one_scalar_line_per_run_and_per_class_once_per_variant(
    scaled: Workspace,
) -> None:
    cmp = json.loads((scaled.root / "comparison.json").read_text())
    lines = [line for v in cmp["variants"] for line in v["runs"]]
    assert len(lines) == (1 + VARIANTS) * SEEDS
    assert all(not isinstance(x, dict | list) for line in lines for x in line["metrics"].values())
    assert all(set(v["mean"].get("per_class") or {}) == {"refund", "shipping", "login"}
               for v in cmp["variants"])  # fmt: skip
    per_run = max(len(json.dumps(line)) for line in lines)
    assert per_run < 600, per_run  # a run costs one short line, whatever the class count
