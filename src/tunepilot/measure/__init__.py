"""Measuring what a run really used: the software and hardware stack (env.py, B2) and memory.

Nothing here trusts an environment's *name*: versions are read from the installed packages and
the devices themselves, so a run records what it actually saw and a later run can say what
changed (B1: a platform change means redoing start-up and quality checks).
"""
