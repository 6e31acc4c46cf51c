"""Experiments (H3, H4, V1-V7): runs of variants x seeds against the control and the baseline.

    runner.py       one run: data, model, the loop, evaluations, ledger rows
    flow.py         the bodies of `baseline`, `run`, `resume`, `runs`
    jobs.py         side-by-side runs and torchrun launches (B3, B4); worker.py is their entry
    evaluate.py     one evaluation procedure, predictions per example kept
    compare.py      seeds, paired bootstrap intervals, guards, a decision (compare_stats.py)
    guards.py       what must not degrade (H2)
    sealed_test.py  the counted look at the test split (H4)
"""
