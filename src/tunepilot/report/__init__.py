"""The dossier (L4, L5): one self-contained HTML file a colleague can re-read months later.

- `collect.py`: everything in the campaign folder -> one plain dict (`tunepilot report --json`).
- `limits.py`: the observed limits, derived from that dict.
- `charts.py`: inline SVG charts (loss curves, intervals, per-class bars); no script.
- `html.py`, `sections.py`, `results.py`: the page, its set-up half and its results half.
- `flow.py`: the command body, `report_command`.

Importing this package imports nothing heavy (no torch): the report reads files and the ledger.
"""
