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
# a minimal Markdown for plan.md: headings, tables, bold, code, lists, paragraphs
# --------------------------------------------------------------------------------------------


BULLET = re.compile(r"^\s*[-*]\s+")


def _inline(text: str) -> str:
    out = e(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def markdown(text: str) -> str:
    """The subset of Markdown the pilot writes; everything else is a paragraph, escaped."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i].rstrip()
        if not line.strip():
            i += 1
            continue
        heading = re.match(r"^(#{1,4})\s+(.*)$", line)
        if heading:
            level = min(len(heading.group(1)) + 2, 6)
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
            i += 1
        elif line.lstrip().startswith("|"):
            block = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                block.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            rows = [r for r in block if not all(re.fullmatch(r":?-{2,}:?", c) for c in r if c)]
            head, body = rows[0], rows[1:]
            out.append(table([_inline(h) for h in head], [[_inline(c) for c in r] for r in body],
                             "md"))  # fmt: skip
        elif BULLET.match(line):
            items = []
            while i < len(lines) and BULLET.match(lines[i]):
                items.append("<li>" + _inline(BULLET.sub("", lines[i])) + "</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
        else:
            para = []
            while (
                i < len(lines)
                and lines[i].strip()
                and not re.match(r"^(#{1,4}\s|\s*\||\s*[-*]\s)", lines[i])
            ):
                para.append(lines[i].strip())
                i += 1
            out.append(f"<p>{_inline(' '.join(para))}</p>")
    return '<div class="md">' + "".join(out) + "</div>"


def run_colours(d: dict[str, Any]) -> dict[str, str]:
    """One colour per variant: the control first, then the campaign's order, then others."""
    names = ["control", *d["hypothesis"]["variants"], *(r["variant"] for r in d["runs"])]
    return charts.colours(names)
