"""What the pilot tests share: the gate order, a tiny demo campaign, one torch thread.

Imported by `test_pilot*.py` (pytest puts this folder on sys.path).
"""

from __future__ import annotations

from pathlib import Path

import pytest

GATE_NAMES = ["environment", "data", "inspect", "load", "update audit", "first step",
              "steady step", "accumulation", "overfit", "evaluation", "checkpoint", "resume",
              "export"]  # fmt: skip
"""The 13 gates, in the order S4 asks for (first step before steady step, export last)."""

TINY_GOOD = {"data.fields.time": None, "training.lr": 1e-3, "data.max_length": 160}
"""A tiny classification campaign with nothing planted: no time field (no time-overlap WARN),
an lr the tiny BERT learns with, every target within max_length."""


def tiny_campaign(folder: Path, task: str = "classification", **overrides: object) -> Path:
    """The generated ticket campaign on a tiny model, with `overrides` planted on top."""
    from tunepilot.demo.campaign import write_demo_campaign

    base = TINY_GOOD if task == "classification" else {"training.lr": 1e-3, "data.max_length": 256}
    return write_demo_campaign(folder, task, tiny=True, n_conversations=60,
                               overrides={**base, **overrides})  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One torch thread: on a shared 2-core machine two threads stall each other."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
