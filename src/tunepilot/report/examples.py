"""What the chosen variant changed, example by example, against the starting model (H3, V5).

A better mean can hide a class that got worse or a handful of examples that broke; the ledger
keeps every evaluation's per-example predictions, so the dossier can show them: the confusion
matrix of the chosen run (classification), and the validation examples it fixed (the baseline
was wrong, it is right) and broke (the other way round), each with its text and both answers,
in collapsible lists a reader browses without any script.

The chosen run is the adopted variant's first completed seed, else the control's (the run
`tunepilot demo` exports); "right" is the prediction's score (correct label, exact answer).
"""

from __future__ import annotations

from typing import Any

from tunepilot.data.workspace import Workspace
from tunepilot.report.elements import code, e, missing, num, table

SHOWN = 200  # per list: a dossier stays a readable file, the ledger keeps every example
TEXT_CHARS = 240


def changed_examples(
    ws: Workspace, runs: list[dict[str, Any]], cmp: dict[str, Any] | None
) -> dict[str, Any] | None:
    """{run, variant, labels, confusion, fixed, broke, counts}, or None without both sides."""
    wanted = (cmp or {}).get("adopted") or "control"
    done = sorted((r for r in runs if r["variant"] == wanted and r["status"] == "completed"),
                  key=lambda r: (r["seed"], r["id"]))  # fmt: skip
    if not done or not ws.ledger_path.is_file():
        return None
    from tunepilot.ledger import BASELINE, Ledger

    with Ledger.open(ws.ledger_path) as ledger:
        sides, classes = [], []
        for run_id in (BASELINE, done[0]["id"]):
            evals = [x for x in ledger.evaluations(run_id) if x.split == "validation"]
            sides.append({p.example_id: p for p in ledger.predictions(evals[-1].id)}
                         if evals else {})  # fmt: skip
            # every class of the data version, in id order: per_class holds the unseen too
            classes = list((evals[-1].metrics.get("per_class") or {}) if evals else [])
    base, chosen = sides
    if not base or not chosen:
        return None
    texts = _texts(ws)
    out: dict[str, Any] = {"run": done[0]["id"], "variant": wanted, "fixed": [], "broke": [],
                           "counts": {"both right": 0, "both wrong": 0}}  # fmt: skip
    for eid in sorted(base.keys() & chosen.keys()):
        before, after = bool(base[eid].score), bool(chosen[eid].score)
        if before == after:
            out["counts"]["both right" if after else "both wrong"] += 1
            continue
        row = {"id": eid, "text": texts.get(eid, "")[:TEXT_CHARS],
               "gold": _answer(chosen[eid], "gold"), "baseline": _answer(base[eid], "pred"),
               "chosen": _answer(chosen[eid], "pred")}
        out["fixed" if after else "broke"].append(row)
    out["counts"] |= {"fixed": len(out["fixed"]), "broke": len(out["broke"])}
    rows = [p.row or {} for p in chosen.values()]
    if ws.campaign.hypothesis.is_classification and all("gold" in r and "pred" in r for r in rows):
        seen = sorted({str(r[k]) for r in rows for k in ("gold", "pred")} - set(classes))
        labels = list(ws.campaign.data.labels or classes) + seen  # a row's class is never dropped
        labels = list(dict.fromkeys(labels))
        grid = [[0] * len(labels) for _ in labels]
        for r in rows:
            if str(r["gold"]) in labels and str(r["pred"]) in labels:
                grid[labels.index(str(r["gold"]))][labels.index(str(r["pred"]))] += 1
        out["confusion"] = {"labels": labels, "counts": grid}
    return out


def _texts(ws: Workspace) -> dict[str, str]:
    try:
        prepared = ws.prepare(write=False, seal=False)
    except Exception:  # data moved or unreadable: the lists still show ids and answers
        return {}
    return {x.id: x.text for x in prepared.splits.get("validation", [])}


def _answer(p: Any, key: str) -> str:
    """The expected ("gold") or given ("pred") answer as text: the row's own, else its JSON."""
    row = p.row or {}
    value = row.get("gold") if key == "gold" else row.get("pred", row.get("output"))
    return value if isinstance(value, str) else (p.gold if key == "gold" else p.pred)


def examples_section(d: dict[str, Any]) -> str:
    x = d.get("examples")
    if not x:
        return missing("no completed run and baseline evaluation to set side by side (H3)",
                       d["commands"]["baseline"])  # fmt: skip
    c = x["counts"]
    html = (f"<p>The chosen run {code(x['run'])} (variant {e(x['variant'])}) against the starting "
            f"model on the same validation examples (H3): <strong>{c['fixed']} fixed</strong>, "
            f"<strong>{c['broke']} broken</strong>, {c['both right']} right in both, "
            f"{c['both wrong']} wrong in both.</p>")  # fmt: skip
    if x.get("confusion"):
        html += _confusion(x["confusion"])
    for key, what in (("fixed", "fixed (wrong before, right now)"),
                      ("broke", "broken (right before, wrong now)")):  # fmt: skip
        items = x[key]
        more = f", the first {SHOWN} shown" if len(items) > SHOWN else ""
        html += f"<details><summary>{len(items)} example(s) {what}{more}</summary>"
        html += table(["id", "text", "expected", "baseline", "chosen run"],
                      [[code(r["id"]), f'<span class="text">{e(r["text"])}</span>', e(r["gold"]),
                        e(r["baseline"]), e(r["chosen"])] for r in items[:SHOWN]],
                      "changed") if items else "<p>None.</p>"  # fmt: skip
        html += "</details>"
    return html


WIDE = 12  # classes beyond which a confusion table with numbers no longer fits a page
PAIRS = 15  # most confused pairs listed for many classes


def _confusion(m: dict[str, Any]) -> str:
    """Rows: the expected class; columns: what the chosen run predicted; shade by share.

    Up to WIDE classes: the table with every count. More (banking77 has 77): the most confused
    pairs with their counts, then the whole matrix as a heatmap of small cells, columns
    numbered as the rows are, every count in the cell's title: readable at 1400 px with no
    scrollbar, where 77 numbered columns would show 5."""
    labels, counts = m["labels"], m["counts"]
    if len(labels) <= WIDE:
        return _confusion_table(labels, counts)
    return _confused_pairs(labels, counts) + _heatmap(labels, counts)


def _confusion_table(labels: list[str], counts: list[list[int]]) -> str:
    cells = []
    for i, row in enumerate(counts):
        total = sum(row) or 1
        tds = []
        for j, n in enumerate(row):
            share = n / total
            colour = "22,101,52" if i == j else "153,27,27"
            style = f' style="background:rgba({colour},{0.08 + 0.5 * share:.2f})"' if n else ""
            tds.append(f'<td class="{"diag" if i == j else ""}"{style}>{num(n)}</td>')
        cells.append(f"<tr><th>{e(labels[i])} <span class='muted'>(n={sum(row)})</span></th>"
                     + "".join(tds) + "</tr>")  # fmt: skip
    head = "".join(f"<th>{e(label)}</th>" for label in labels)
    return ("<h3>Confusion matrix of the chosen run (rows: expected, columns: predicted)</h3>"
            f'<div class="scroll"><table class="confusion"><thead><tr><th></th>{head}</tr>'
            f"</thead><tbody>{''.join(cells)}</tbody></table></div>")  # fmt: skip


def _confused_pairs(labels: list[str], counts: list[list[int]]) -> str:
    pairs = sorted(((n, i, j) for i, row in enumerate(counts) for j, n in enumerate(row)
                    if i != j and n), key=lambda t: (-t[0], t[1], t[2]))[:PAIRS]  # fmt: skip
    rows = [[e(labels[i]), e(labels[j]), num(n), f"{n / (sum(counts[i]) or 1):.0%}"]
            for n, i, j in pairs]  # fmt: skip
    head = (f"<h3>Most confused pairs of the chosen run ({len(labels)} classes; the "
            f"{min(PAIRS, len(pairs))} largest off-diagonal counts)</h3>")
    if not rows:
        return head + "<p>No example was confused.</p>"
    return head + table(["expected", "predicted", "examples", "share of expected"], rows,
                        "confused-pairs")  # fmt: skip


def _heatmap(labels: list[str], counts: list[list[int]]) -> str:
    """Every cell a small square shaded by its share of the row; numbers in titles."""
    out = []
    for i, row in enumerate(counts):
        total = sum(row) or 1
        tds = []
        for j, n in enumerate(row):
            colour = "22,101,52" if i == j else "153,27,27"
            shade = f"background:rgba({colour},{0.12 + 0.88 * n / total:.2f})" if n else ""
            tip = f"{labels[i]} predicted as {labels[j]}: {n} of {sum(row)}"
            tds.append(f'<td style="{shade}" title="{e(tip)}"></td>')
        out.append(f'<tr><th title="{e(labels[i])}">{i + 1}. {e(labels[i])}</th>'
                   + "".join(tds) + "</tr>")  # fmt: skip
    head = "".join(f"<th>{j + 1}</th>" for j in range(len(labels)))
    return ("<h3>Confusion heatmap (rows: expected, numbered; columns: predicted, by the same "
            "numbers; green: right, red: confused, darker: a larger share of the row; hover a "
            "cell for its count)</h3>"
            f'<table class="heatmap"><thead><tr><th></th>{head}</tr></thead>'
            f"<tbody>{''.join(out)}</tbody></table>")  # fmt: skip
