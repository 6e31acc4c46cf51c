"""Sizing (S1, S3, S5-S7, L1-L3): what a campaign needs before a GPU is rented.

    catalog.py       the editable GPU catalog (gpus.yaml): memory, backend, prices
    memory_model.py  bytes as a function of (microbatch, length), fitted and checked held-out
    sheet.py         the bytes breakdown, the updates arithmetic, a fit verdict per card (L1)
    rental.py        hours per phase and the smallest 3-, 7- or 30-day package that fits (L3)

Importing this package imports nothing heavy.
"""
