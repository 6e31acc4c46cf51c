"""The pilot (S1, S4-S7, B1, L2): every operation of the campaign once, before paying for a GPU.

    gates.py   the 13 phases in order, each a PASS / WARN / FAIL row with memory and time
    phases.py  what each phase runs (the real loop, checkpoint, evaluation, export)
    child.py   the resume and reload phases, in a new process
    stale.py   a changed platform fingerprint makes earlier pilots STALE (B1)
    flow.py    the bodies of `tunepilot pilot` and `tunepilot plan`

What a campaign needs (memory per card, hours, the 3/7/30-day package) is computed in
`tunepilot.sizing`; the pilot feeds it measurements.
"""
