"""The pilot (S1, S4-S7, L1-L3): every operation of the campaign once, before paying for a GPU.

- `gates.py`: the phases in order, each a PASS / WARN / FAIL row with memory and time.
- `sizing.py`: the bytes model, the fitted memory model, the updates arithmetic and the
  selection sheet with a fit verdict per catalog card.
- `rental.py`: hours per phase and the smallest 3-, 7- or 30-day package that fits.
- `catalog.py`: the editable GPU catalog those two read.

Importing this package imports nothing heavy; the memory probe lives in
`tunepilot.measure.memory` so the training loop can use it without reaching up into the pilot.
"""
