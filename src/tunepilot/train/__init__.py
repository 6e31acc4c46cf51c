"""Training: the loop and the building blocks it reads like a chapter from (S2, S3, S7, R1, R4).

    arithmetic.py  examples per update, updates per epoch, what is held fixed (pure Python)
    batching.py    the deterministic, resumable, shardable sampler; dynamic-padding collate
    schedule.py    lr as a pure function of the update index
    loop.py        `train(...)`: microbatches, token-weighted accumulation, AMP, stop causes
    checkpoint.py  atomic step folders, manifest with sha256, safe loading only
    rng.py         seeding, saving and restoring every generator

Importing this package stays cheap (no torch): only the pure arithmetic is re-exported here;
import `tunepilot.train.loop` where training really happens.
"""

from tunepilot.train.arithmetic import UpdatePlan, plan_from_settings, plan_updates

__all__ = ["UpdatePlan", "plan_from_settings", "plan_updates"]
