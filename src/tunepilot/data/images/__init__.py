"""Image folders and tables (D2, D3, D4, D8 for image classification campaigns).

    load.py       class folders or a table of paths -> examples, every file hashed
    facts.py      what one decoded file is (size, mode, format, EXIF, a thumbnail)
    audit.py      the image audit's order of checks: unusable files, exact and near copies
                  across splits, file properties or pixels that alone identify a class
    near.py       near-duplicate images (perceptual hash, then a pixel comparison)
    shortcuts.py  a file property that predicts the class on its own
    show.py       `data show` for images: every preprocessing step with shape and range
    sheet.py      the pictures: contact sheet, near-duplicate pairs

May import the data stage's building blocks, `data.audit.labels`/`units` (the shared finding
helpers), tasks, campaign and the shared leaves; never `data.workspace` or `data.flow`
(import-linter contract in pyproject.toml).
"""
