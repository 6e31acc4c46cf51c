"""Markdown that user text cannot escape from: the one escaper for everything tunepilot writes
as Markdown a person or the Hub renders (the model card), with HTML allowed by the renderer.

`escape` makes text literal inline text, `code` an inline code span, `fenced` a code block;
none can be closed by what they hold, so a class name, a behaviour or a file name never
becomes a tag, an image, a link or a heading. Standard library only.
"""

from __future__ import annotations

import re
from typing import Any

_ESCAPED = {c: "\\" + c for c in "\\`*_[]!|#~"} | {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def escape(text: Any, line_start: bool = False) -> str:
    """`text` as literal Markdown inline text: one line (no heading, list or fence can
    start), HTML's `<`, `>`, `&` as entities, and the characters that make emphasis, code,
    links, images and table cells backslash-escaped. `line_start`: the text begins a line,
    so a leading `-`, `+`, `=` or `1.` is escaped too. The one escaper for every user string."""
    flat = "".join(ch for ch in " ".join(str(text).split()) if ch.isprintable())
    out = "".join(_ESCAPED.get(ch, ch) for ch in flat)
    if not line_start:
        return out
    if out[:1] in ("-", "+", "="):
        out = "\\" + out
    return re.sub(r"^(\d+)([.)])", r"\1\\\2", out)


def code(text: Any) -> str:
    """`text` as an inline code span it cannot close: one line, delimited by more backticks
    than any run inside it. A code span shows its content literally (no markup, no HTML)."""
    flat = "".join(ch for ch in " ".join(str(text).split()) if ch.isprintable())
    longest = max((len(m) for m in re.findall(r"`+", flat)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{ticks}{pad}{flat}{pad}{ticks}"


def fenced(code: str, info: str = "") -> str:
    """A fenced code block that `code` cannot close: the fence is longer than any run of
    backticks inside it (CommonMark)."""
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{code}\n{fence}"
