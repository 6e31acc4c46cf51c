"""The text data audit (D2, D5, D6, D8): every check over the prepared splits, PASS/WARN/FAIL.

    run.py      the audit's order of checks, audit.json, and the duplicate findings (D2)
    dedup.py    exact duplicates after normalisation and MinHash/LSH near-duplicates
    labels.py   labels and lengths: unseen classes, balance, the id<->name mapping (D6),
                truncation and the model's positions; also the shared sentence helpers
    units.py    the leakage unit (D8): groups across splits, time periods that overlap
    answers.py  gold answers held to the campaign's target schema before any training
    chat.py     chat rows: repeated user turns, shared openings, turn ends
    conflicts.py  one text under two labels (deduplicated copies included), two spellings
    leakage.py  the answer written in the input: class names, pasted answers, echoed turns
    shape.py    splits built alike: system prompts and template parts in every split
    tokens.py   special tokens written once (no BOS or EOS twice); one encoding per row

May import the data stage's own building blocks (prepared, clean, normalize, split, generic),
tasks, campaign and the shared leaves; never `data.workspace`, `data.flow` or `data.images`
(import-linter contract in pyproject.toml). The image audit reuses `labels` and `units`
from `data.images.audit`.
"""
