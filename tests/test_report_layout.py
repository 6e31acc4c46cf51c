"""What a colleague sees at 1400 px in Debian's chromium (L4, L5): a confusion matrix of many
classes (banking77's 77) is its most confused pairs and a heatmap that fits the page, not 5
of 77 numbered columns behind a scrollbar; the per-class chart leaves room for the longest
class name instead of cutting it at the chart's edge. Measured in the browser (layout boxes
written into the page by a script, read back with --dump-dom)."""

from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1000", "--virtual-time-budget=3000"]  # fmt: skip
MEASURE = """<script>
window.onload = () => { const out = {scroll: [], names: [], heatmap: null};
 document.querySelectorAll('.scroll').forEach(
   el => out.scroll.push([el.scrollWidth, el.clientWidth]));
 document.querySelectorAll('svg text.name').forEach(
   t => out.names.push(t.getBoundingClientRect().left));
 const h = document.querySelector('table.heatmap'), box = document.querySelector('section');
 if (h) out.heatmap = [h.getBoundingClientRect().right, box.getBoundingClientRect().right];
 document.getElementById('out').textContent = JSON.stringify(out); };
</script>"""


def _measure(tmp_path: Path, body: str) -> dict:
    from tunepilot.report.html import CSS

    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is absent (Debian's chromium; .ci/run installs it)")
    page = tmp_path / "page.html"
    page.write_text(f"<!doctype html><html><head><meta charset=utf-8><style>{CSS}</style>"
                    f'</head><body><div class="wrap"><section>{body}</section></div>'
                    "<pre id=out></pre>"
                    f"{MEASURE}</body></html>", encoding="utf-8")  # fmt: skip
    done = subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           "--dump-dom", page.as_uri()], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    found = re.search(r'<pre id="out">(.*?)</pre>', done.stdout, re.S)
    assert found and found[1], done.stderr[-2000:]
    return json.loads(found[1].replace("&quot;", '"'))


@pytest.mark.realdata
def test_l5_many_classes_show_confused_pairs_and_a_heatmap_that_fits_1400px(
    shared_data: Path, tmp_path: Path
):
    from tunepilot.report.examples import _confusion

    labels = json.loads((shared_data / "banking77" / "categories.json").read_text())
    assert len(labels) == 77
    rng = random.Random(0)
    counts = [[20 if i == j else rng.choice([0] * 30 + [1, 2, 4]) for j in range(77)]
              for i in range(77)]  # fmt: skip
    counts[5][9] = 17  # the most confused pair
    html = _confusion({"labels": labels, "counts": counts})
    assert "Most confused pairs" in html and html.count("<tr") > 77
    first = re.search(r'<table class="confused-pairs">.*?<tbody><tr[^>]*>(.*?)</tr>', html, re.S)
    assert first and labels[5] in first[1] and labels[9] in first[1] and ">17<" in first[1]
    seen = _measure(tmp_path, html)
    right, card = seen["heatmap"]
    assert right <= card  # all 77 columns inside the dossier's card, no scrollbar
    assert all(scroll <= client for scroll, client in seen["scroll"])


def test_l5_the_per_class_chart_never_cuts_a_long_class_name(tmp_path: Path):
    from tunepilot.report import charts

    names = ["card_payment_wrong_exchange_rate", "Refund_not_showing_up",
             "transfer_fee_charged_for_an_international_wire", "atm"]
    chart = charts.bar_chart(names, [charts.Bars("control", "#1f77b4", dict.fromkeys(names, .5))],
                             title="per class", metric="f1",
                             notes=dict.fromkeys(names, "(n=240)"))  # fmt: skip
    seen = _measure(tmp_path, chart)
    assert len(seen["names"]) == 4 and min(seen["names"]) >= 0, seen["names"]


def test_l5_a_few_classes_keep_the_full_confusion_table():
    from tunepilot.report.examples import _confusion

    html = _confusion({"labels": ["a", "b"], "counts": [[3, 1], [0, 4]]})
    assert 'class="confusion"' in html and "heatmap" not in html
