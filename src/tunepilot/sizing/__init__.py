"""Sizing (S1, S3-S7, B3, B4, L1-L3): what a campaign needs before a GPU is rented.

    dry_run/          the campaign's exact step on fake tensors: bytes and FLOPs per phase
    phase_size.py     the per-phase record the dry run writes and the sheet reads
    catalog.py        the editable GPU catalog (gpus.yaml): memory, peaks, precisions, stack
    fit.py            THE verdict of a card: every phase, every precision, the headroom, per
                      layout of a machine (one GPU, side by side, DDP, FSDP)
    throughput.py     the utilisation calibrated on published measurements, per method
    timing.py         seconds per phase: FLOPs over a card's peak, or a pilot's measured step
    options.py        each S3 option sized on the phase it changes
    machine.py        a machine as the engine runs it: the fastest layout that fits, commands
    sheet.py          the bytes breakdown, the updates arithmetic, one row per card (L1)
    sheet_markdown.py the sheet as Markdown tables
    rental.py         hours per phase and the smallest 3-, 7- or 30-day package that fits (L3)
    recommend.py      the cheapest (else smallest) machine that fits, by one explicit ranking
    nearest.py        the nearest change that makes a card fit, each tried as a dry run

The pilot's fitted memory model lives with the pilot (`pilot/memory_fit.py`): it answers a
different question, how this machine's measured bytes grow with microbatch and length.
Importing this package imports nothing heavy.
"""
