"""Delivery (P4, R2-R4): the export bundle and its check in a new process.

    export.py        adapter or model, tokenizer, base revision and hashes, control inputs
    bundle_check.py  hashes, safe formats and the control replay; runs as its own process
    verify.py        `tunepilot verify`: starts that process, records the result
"""
