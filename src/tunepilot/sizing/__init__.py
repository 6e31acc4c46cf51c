"""Sizing (S1, S3, S5-S7, L1-L3): what a campaign needs before a GPU is rented.

    dry_run/          the campaign's exact step on fake tensors: bytes and FLOPs per phase
    phase_size.py     the per-phase record the dry run writes and the sheet reads
    catalog.py        the editable GPU catalog (gpus.yaml): memory, peaks, backend, prices
    timing.py         seconds per phase: FLOPs over a card's peak, or a pilot's measured step
    sheet.py          the bytes breakdown, the updates arithmetic, a fit verdict per card (L1)
    sheet_markdown.py the sheet as Markdown tables
    rental.py         hours per phase and the smallest 3-, 7- or 30-day package that fits (L3)
    recommend.py      the smallest fitting card, in one sentence

The pilot's fitted memory model lives with the pilot (`pilot/memory_fit.py`): it answers a
different question, how this machine's measured bytes grow with microbatch and length.
Importing this package imports nothing heavy.
"""
