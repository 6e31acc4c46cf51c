"""Image folders and tables (D2, D3, D4, D8 for image classification campaigns).

    load.py       class folders or a table of paths -> examples, every file hashed
    facts.py      what one decoded file is (size, mode, format, EXIF, a thumbnail)
    audit.py      the image audit's order of checks: unusable files, exact and near copies
                  across splits, file properties or pixels that alone identify a class
    near.py       near-duplicate images (perceptual hash, then a pixel comparison)
    shortcuts.py  a file property that predicts the class on its own
    crops.py      cropped copies across splits (a grid of boxes, confirmed pixel for pixel)
    pixels.py     a border or watermark that tells a class, grey vs colour per split, flips
                  that turn one class into another
    processed.py  the pixel range the model's processor really hands the model
    show.py       `data show` for images: every preprocessing step with shape and range
    sheet.py      the pictures: contact sheet, near-duplicate pairs

May import the data stage's building blocks, `data.audit.labels`/`units` (the shared finding
helpers), tasks, campaign and the shared leaves; never `data.workspace` or `data.flow`
(import-linter contract in pyproject.toml).
"""
