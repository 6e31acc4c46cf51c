"""A bound on rendering a chat template: time and output, so a template cannot hang a command.

A chat template is a Jinja program shipped with a model (or pasted into the campaign). Jinja's
sandbox stops it from touching the machine but not from looping: two nested `range(99999)`
loops are ten billion iterations, and `data audit` then gives no answer at all. A conversation
renders in milliseconds, so each rendering gets `RENDER_SECONDS` of wall time and its text
`max_chars(...)` characters; past either it is refused as bad input naming the template.

The time bound is a SIGALRM timer (`signal.setitimer`), which interrupts Python code between
bytecodes, Jinja's compiled loops included; it raises a BaseException so that no library's
`except Exception` swallows it. Signals reach the main thread only: elsewhere (a worker
thread) the output bound still holds and the time bound is not set.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

RENDER_SECONDS = 10.0
BASE_CHARS = 1 << 20  # what a template may add around a conversation (system prompts, tools)
GROWTH = 8  # and how many times the conversation's own text it may repeat


class RenderTimeout(BaseException):  # noqa: N818 (it is an interruption, like KeyboardInterrupt)
    """Rendering one conversation took longer than its bound."""


def max_chars(turns: list[dict[str, Any]]) -> int:
    """The longest rendering a conversation may have: its text GROWTH times, plus BASE_CHARS."""
    return BASE_CHARS + GROWTH * sum(len(str(t.get("content") or "")) for t in turns)


def rendered_size(result: Any) -> int:
    """Characters of a rendered text, or tokens of a tokenized rendering (a dict or ids)."""
    if isinstance(result, str):
        return len(result)
    ids = result.get("input_ids") if isinstance(result, dict) else result
    return len(ids) if isinstance(ids, list) else 0


@contextmanager
def time_bound(seconds: float | None = None) -> Iterator[None]:
    """Raise RenderTimeout inside the block once `seconds` (RENDER_SECONDS) have passed."""
    seconds = RENDER_SECONDS if seconds is None else seconds
    if threading.current_thread() is not threading.main_thread() or not hasattr(
            signal, "setitimer"):  # fmt: skip
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise RenderTimeout

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
