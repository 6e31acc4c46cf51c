"""Data: load (line-numbered errors) -> clean (declared rules) -> version (hashes) -> split
(sealed test) -> audit (duplicates, leakage, labels, truncation) -> inspect (tokens + loss mask).

`workspace.py` opens a campaign folder (its data, tokenizer and task encoder); `flow.py` holds
the bodies of `data audit` and `data show`.
"""
