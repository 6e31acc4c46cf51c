"""The dry run (S1, S3, S5): the campaign's exact step executed on fake tensors, no GPU needed.

It answers "what will this step need on a card I do not have?": the target's config.json builds
the model on meta tensors through the code a run uses (`model.build`, `train.optimizer`,
`train.batching`), and every phase the pilot measures runs once with each live storage counted.

    run.py        the driver: phases, 2- and 3-block extrapolation, the DryRun record
    measure.py    one phase on meta tensors: build, batch, forward/backward/step, FLOPs
    tracker.py    every live storage counted by role (weights, gradients, optimizer, ...)
    shape.py      the input shape a phase is sized at (longest examples, positions, attention)
    config.py     a shipped or local config.json, read and checked as bad input
    attention.py  attention as the target backend runs it (fused SDPA/flash or eager)
    autocast.py   autocast's casts replayed on meta tensors (autocast does nothing there)
    quant.py      nf4/int8 weights at their bitsandbytes storage size
    images.py     image campaigns' pixel inputs from the base's processor config
    check.py      the same step on real tensors, to hold the prediction to the profiler
    flow.py       the body of `tunepilot size`

May import the stages below sizing (train, data, tasks, model, measure, campaign) and
`sizing.catalog`/`sizing.phase_size`/`sizing.fit` (the one verdict `size --gpu` prints);
never the sheet, the timing, the options, the machine layouts, the rental plan, the
recommendation or the nearest-change search, which read its results (an import-linter
contract in pyproject.toml). Importing this package imports nothing heavy.
"""
