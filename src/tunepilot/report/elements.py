"""The building blocks every dossier section is written with: escaping, numbers, tables, badges.

Every string that came from a user or a file passes through `e()` (html.escape) before it
reaches the page; only markup written here is left unescaped.
"""

from __future__ import annotations

import json
import re
from html import escape
from typing import Any

from tunepilot.report import charts


def e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def num(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return e(value) if value is not None else "–"
    return f"{value:,}" if isinstance(value, int) else f"{value:.{digits}f}"


def prose(value: Any) -> str:
    """A sentence from tunepilot (decision, guard, limit): escaped, then `x` shown as code."""
    return re.sub(r"`([^`<>]+)`", r"<code>\1</code>", e(value))


def id_list(values: Any, n: int = 3) -> str:
    """The first `n` example ids, each kept on one line: an id cut at its hyphen misleads."""
    return ", ".join(f'<span class="nowrap">{e(v)}</span>' for v in list(values or [])[:n])


def badge(word: Any) -> str:
    w = str(word or "–")
    return f'<span class="badge b-{e(w.lower())}">{e(w)}</span>'


def table(head: list[str], rows: list[list[str]], cls: str = "",
          row_cls: list[str] | None = None) -> str:  # fmt: skip
    """Cells are HTML already (escaped by the caller)."""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join(
        f'<tr class="{(row_cls or [""] * len(rows))[i]}">' + "".join(f"<td>{c}</td>" for c in r)
        + "</tr>" for i, r in enumerate(rows)
    )  # fmt: skip
    return (
        f'<div class="scroll"><table class="{cls}"><thead><tr>{th}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def missing(sentence: str, command: str | None = None) -> str:
    cmd = f' Run <code class="cmd">{e(command)}</code> to fill it.' if command else ""
    return f'<p class="missing"><strong>Missing:</strong> {e(sentence)}.{cmd}</p>'


def dl(items: list[tuple[str, str]]) -> str:
    return '<dl class="kv">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def code(value: Any) -> str:
    """Inline code; a dict or list shows as JSON (what the files hold), not as Python."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return f"<code>{e(text)}</code>"


def flat(obj: Any, prefix: str = "") -> dict[str, str]:
    """Nested dicts as dotted keys -> compact JSON values (for side-by-side hypotheses)."""
    if isinstance(obj, dict) and obj:
        out: dict[str, str] = {}
        for k, v in obj.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: json.dumps(obj, ensure_ascii=False)}


# --------------------------------------------------------------------------------------------
# Markdown (plan.md, the sizing sheet): markdown-it-py, raw HTML off
# --------------------------------------------------------------------------------------------


def markdown(text: str) -> str:
    """CommonMark plus tables, rendered by markdown-it-py with raw HTML, images and links
    disabled: a `<tag>`, an `![image](http://...)`, a `[link](...)` or an `<autolink>` in the
    text (a GPU catalog's card name reaches plan.md) shows as the text it is, so the dossier
    never loads or points anywhere. Headings move down two levels to sit under the section's
    h2, and a wide table scrolls inside its card."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
    md.disable(["image", "link", "autolink", "reference"])
    tokens = md.parse(text)
    for token in tokens:
        if token.type in ("heading_open", "heading_close"):
            token.tag = f"h{min(int(token.tag[1]) + 2, 6)}"
    html = md.renderer.render(tokens, md.options, {})
    html = html.replace("<table>", '<div class="scroll"><table class="md">').replace(
        "</table>", "</table></div>")  # fmt: skip
    return f'<div class="md">{html}</div>'


def run_colours(d: dict[str, Any]) -> dict[str, str]:
    """One colour per variant: the control first, then the campaign's order, then others."""
    names = ["control", *d["hypothesis"]["variants"], *(r["variant"] for r in d["runs"])]
    return charts.colours(names)
