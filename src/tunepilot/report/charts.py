"""Charts of the dossier as inline SVG strings: no JavaScript, no plotting library, no network.

Why hand-written SVG: the dossier must open months later, offline, in any browser, from one
file (L4, L5); a chart library would be a script to embed and a dependency to keep, and
matplotlib is not part of the install. Three shapes cover what the dossier shows:

- `line_chart`: loss per update and validation points per run (V5); a run that diverged ends
  with a cross, one that stopped early with an open circle, so no failure hides in a line.
- `interval_chart`: each variant's bootstrap interval of the difference to the control, with
  the zero line the decision is judged against (V6, V7).
- `bar_chart`: per-class (per-field) scores of the baseline, the control and the best variant,
  side by side (H2, H3).

Every text that reaches the SVG goes through `esc`: class names and run ids come from users.
The SVG is inline HTML5, so it carries no namespace URL: the file holds no address at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#2563eb", "#ea580c", "#059669", "#9333ea", "#dc2626", "#0891b2", "#ca8a04",
           "#db2777", "#4d7c0f", "#7c3aed", "#0f766e", "#b45309")  # fmt: skip
BASELINE_COLOUR = "#9ca3af"
DASHES = ("", "6 3", "2 3", "8 3 2 3")  # one per seed position: a variant keeps its colour
MAX_POINTS = 600  # a line with more points is thinned (the last point is always kept)
FONT = "font-family=\"Inter, 'Segoe UI', Helvetica, Arial, sans-serif\""


def esc(value: object) -> str:
    """Text safe inside SVG/HTML content and attributes."""
    return escape(str(value), quote=True)


def colours(names: Sequence[str]) -> dict[str, str]:
    """A stable colour per name, in the order given (the control first gets blue)."""
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(dict.fromkeys(names))}


def nice_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """About `n` round tick values covering [lo, hi] (1, 2, 2.5, 5 x 10^k steps); whole
    numbers only when `integer` (updates are counted, never fractional)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    if integer:
        step = max(1.0, float(math.ceil(step)))
    start = math.floor(lo / step) * step
    ticks, value = [], start
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def fmt(value: float) -> str:
    """A short tick label: 0.25, 1.5k, 3e-05."""
    if value == 0:
        return "0"
    a = abs(value)
    if a >= 1000:
        return f"{value / 1000:g}k"
    if a < 1e-3:
        return f"{value:.0e}"
    return f"{value:.4g}"


Points = list[tuple[float, float | None]]


@dataclass
class Series:
    """One line: points (x, y); y None or non-finite is a gap. `end` marks how it ended."""

    name: str
    colour: str
    points: Points
    dash: str = ""
    end: str = ""  # "" (finished), "diverged" (cross) or "stopped" (open circle)
    dots: bool = False  # draw every point (validation points) as well as the line
    label: str = ""  # tooltip text; the name when empty
    faint: bool = False  # the raw line under its smoothed one: thin and light


def smoothed(points: Points, weight: float) -> Points:
    """TensorBoard's smoothing: an exponential moving average, debiased so the first points
    are not pulled towards zero; a gap (non-finite loss) stays a gap."""
    out: Points = []
    last, steps = 0.0, 0
    for x, y in points:
        if not _finite(y):
            out.append((x, y))
            continue
        assert y is not None
        steps += 1
        last = last * weight + (1 - weight) * y
        out.append((x, last / (1 - weight**steps)))
    return out


@dataclass
class Frame:
    """Plot area and data ranges; maps data to pixels."""

    width: int
    height: int
    x0: float
    x1: float
    y0: float
    y1: float
    left: int = 56
    right: int = 16
    top: int = 14
    bottom: int = 40
    integer_x: bool = False

    def x(self, v: float) -> float:
        span = (self.x1 - self.x0) or 1.0
        return self.left + (v - self.x0) / span * (self.width - self.left - self.right)

    def y(self, v: float) -> float:
        span = (self.y1 - self.y0) or 1.0
        v = min(max(v, self.y0), self.y1)
        return (
            self.height
            - self.bottom
            - (v - self.y0) / span * (self.height - self.top - self.bottom)
        )


def _thin(points: Points) -> Points:
    if len(points) <= MAX_POINTS:
        return points
    step = math.ceil(len(points) / MAX_POINTS)
    return points[::step] + ([points[-1]] if (len(points) - 1) % step else [])


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _y_range(values: list[float], y_range: tuple[float, float] | None) -> tuple[float, float]:
    """The given range, or the data's; one huge value (a blow-up) must not flatten the rest,
    so the top is capped near the 98th percentile when the maximum is far above it."""
    if y_range is not None:
        return y_range
    if not values:
        return 0.0, 1.0
    ordered = sorted(values)
    lo, hi = ordered[0], ordered[-1]
    p98 = ordered[min(len(ordered) - 1, int(0.98 * (len(ordered) - 1)))]
    if p98 > lo and hi - lo > 4 * (p98 - lo):
        hi = p98 + 0.25 * (p98 - lo)
    pad = (hi - lo) * 0.06 or abs(hi) * 0.1 or 1.0
    return (lo - pad if lo - pad > 0 or lo < 0 else 0.0), hi + pad


def _tick(
    line: tuple[float, float, float, float], kind: str, at: tuple[float, float], anchor: str,
    value: float,
) -> list[str]:
    """One tick: its line (x1, x2, y1, y2) of class `kind` and its label at `at`."""
    x1, x2, y1, y2 = line
    return [f'<line x1="{x1:.1f}" x2="{x2:.1f}" y1="{y1:.1f}" y2="{y2:.1f}" class="{kind}"/>',
            f'<text x="{at[0]:.1f}" y="{at[1]:.1f}" text-anchor="{anchor}" '
            f'class="tick">{esc(fmt(value))}</text>']  # fmt: skip


def _axes(f: Frame, x_label: str, y_label: str) -> list[str]:
    out: list[str] = []
    base = f.height - f.bottom
    for t in nice_ticks(f.y0, f.y1):
        if f.y0 <= t <= f.y1:
            y = f.y(t)  # a grid line across the plot, its value left of the axis
            out += _tick((f.left, f.width - f.right, y, y), "grid", (f.left - 6, y + 4), "end", t)
    for t in nice_ticks(f.x0, f.x1, 6, integer=f.integer_x):
        if f.x0 <= t <= f.x1:
            x = f.x(t)  # a short mark below the axis, its value under it
            out += _tick((x, x, base, base + 4), "axis", (x, base + 16), "middle", t)
    out.append(f'<line x1="{f.left}" x2="{f.width - f.right}" y1="{base}" y2="{base}" '
               'class="axis"/>')  # fmt: skip
    out.append(f'<line x1="{f.left}" x2="{f.left}" y1="{f.top}" y2="{base}" class="axis"/>')
    out.append(f'<text x="{(f.left + f.width - f.right) / 2:.0f}" y="{f.height - 6}" '
               f'text-anchor="middle" class="label">{esc(x_label)}</text>')  # fmt: skip
    mid = (f.top + base) / 2
    out.append(f'<text x="12" y="{mid:.0f}" text-anchor="middle" class="label" '
               f'transform="rotate(-90 12 {mid:.0f})">{esc(y_label)}</text>')  # fmt: skip
    return out


def _svg(width: int, height: int, title: str, body: list[str], kind: str) -> str:
    return (
        f'<svg class="chart {kind}" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'preserveAspectRatio="xMinYMin meet" {FONT}>'
        f"<title>{esc(title)}</title>" + "".join(body) + "</svg>"
    )


def line_chart(series: list[Series], *, title: str, x_label: str, y_label: str,
               width: int = 1100, height: int = 320, x_min: float | None = None,
               y_range: tuple[float, float] | None = None) -> str:  # fmt: skip
    """Lines over a shared x axis; values above the capped range are drawn on the top edge
    with a small triangle, so a blow-up stays visible without flattening every other line.
    `x_min` pins the left end (0 for updates, so a run that stopped at update 1 shows it)."""
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points if _finite(y)]
    lo, hi = _y_range(ys, y_range)
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x_min is not None:
        x0 = min(x_min, x0)
    f = Frame(width, height, x0, x1 if x1 > x0 else x0 + 1, lo, hi,
              integer_x=all(float(x).is_integer() for x in xs))  # fmt: skip
    body = _axes(f, x_label, y_label)
    for s in series:
        pts = _thin(s.points)
        label = esc(s.label or s.name)
        segments: list[list[str]] = [[]]
        for x, y in pts:
            if not _finite(y):
                segments.append([])
                continue
            assert y is not None
            segments[-1].append(f"{f.x(x):.1f},{f.y(y):.1f}")
            if y > f.y1:
                body.append(f'<path d="M{f.x(x) - 4:.1f},{f.top + 6} l4,-7 l4,7 z" '
                            f'fill="{s.colour}" class="clip"><title>{label}: {esc(fmt(y))} '
                            "(above the axis)</title></path>")  # fmt: skip
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        for seg in segments:
            if len(seg) > 1:
                look = 'stroke-width="1" stroke-opacity="0.35"' if s.faint else 'stroke-width="1.8"'
                body.append(f'<polyline points="{" ".join(seg)}" fill="none" stroke="{s.colour}" '
                            f'{look}{dash} class="line{" raw" if s.faint else ""}"><title>{label}'
                            "</title></polyline>")  # fmt: skip
        finite = [(x, y) for x, y in pts if _finite(y)]
        if s.dots or len(finite) == 1:
            for x, y in finite:
                assert y is not None
                body.append(f'<circle cx="{f.x(x):.1f}" cy="{f.y(y):.1f}" r="3.2" '
                            f'fill="{s.colour}" class="point"><title>{label}: update '
                            f"{esc(fmt(x))}, {esc(f'{y:.4g}')}</title></circle>")  # fmt: skip
        if s.end and pts:
            body.append(_end_marker(f, s, pts, label))
    return _svg(width, height, title, body, "line-chart")


def _end_marker(f: Frame, s: Series, pts: Points, label: str) -> str:
    """A cross where a diverged line ends (at the top edge when its last loss is not finite),
    an open circle where a stopped one ends."""
    x, y = pts[-1]
    if not _finite(y):
        finite = [p for p in pts if _finite(p[1])]
        y = f.y1 if s.end == "diverged" or not finite else finite[-1][1]
    assert y is not None
    cx, cy = f.x(x), f.y(y)
    if s.end == "diverged":
        return (f'<path d="M{cx - 5:.1f},{cy - 5:.1f} l10,10 M{cx - 5:.1f},{cy + 5:.1f} l10,-10" '
                f'stroke="{s.colour}" stroke-width="2.6" class="end-diverged"><title>{label}: '
                f"diverged at update {esc(fmt(x))}</title></path>")  # fmt: skip
    return (f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="white" stroke="{s.colour}" '
            f'stroke-width="2" class="end-stopped"><title>{label}: stopped at update '
            f"{esc(fmt(x))}</title></circle>")  # fmt: skip


@dataclass
class Interval:
    name: str
    colour: str
    diff: float
    low: float
    high: float
    note: str = ""


def interval_chart(rows: list[Interval], *, title: str, metric: str, level: float) -> str:
    """Horizontal intervals of (variant - control) with the zero line: above 0 is a gain the
    bootstrap supports, an interval that crosses 0 is not (V6, V7)."""
    width, row_h, left, right, top = 1100, 34, 170, 190, 14
    height = top + row_h * max(len(rows), 1) + 44
    lo = min([0.0] + [r.low for r in rows])
    hi = max([0.0] + [r.high for r in rows])
    pad = (hi - lo) * 0.08 or 0.01
    f = Frame(width, height, lo - pad, hi + pad, 0, 1, left=left, right=right, top=top)
    body: list[str] = []
    for t in nice_ticks(f.x0, f.x1, 6):
        if f.x0 <= t <= f.x1:
            x = f.x(t)
            body += _tick((x, x, top, height - 40), "grid", (x, height - 26), "middle", t)
    zx = f.x(0.0)
    body.append(f'<line x1="{zx:.1f}" x2="{zx:.1f}" y1="{top - 4}" y2="{height - 36}" '
                'class="zero"/>')  # fmt: skip
    body.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 6}" '
                f'text-anchor="middle" class="label">difference in {esc(metric)} vs the control '
                f"({level:.0%} paired bootstrap interval)</text>")  # fmt: skip
    for i, r in enumerate(rows):
        cy = top + row_h * i + row_h / 2
        above = r.low > 0
        body.append(f'<text x="{left - 10}" y="{cy + 4:.1f}" text-anchor="end" class="name">'
                    f"{esc(r.name)}</text>")  # fmt: skip
        body.append(f'<line x1="{f.x(r.low):.1f}" x2="{f.x(r.high):.1f}" y1="{cy:.1f}" '
                    f'y2="{cy:.1f}" stroke="{r.colour}" stroke-width="3" class="interval">'
                    f"<title>{esc(r.name)}: {r.diff:+.4f} [{r.low:+.4f}, {r.high:+.4f}]</title>"
                    "</line>")  # fmt: skip
        for end in (r.low, r.high):
            body.append(f'<line x1="{f.x(end):.1f}" x2="{f.x(end):.1f}" y1="{cy - 7:.1f}" '
                        f'y2="{cy + 7:.1f}" stroke="{r.colour}" stroke-width="2"/>')  # fmt: skip
        body.append(f'<circle cx="{f.x(r.diff):.1f}" cy="{cy:.1f}" r="5" fill="{r.colour}" '
                    'class="point"/>')  # fmt: skip
        words = f"{r.diff:+.3f} [{r.low:+.3f}, {r.high:+.3f}]"
        body.append(f'<text x="{width - right + 8}" y="{cy + 4:.1f}" class="value'
                    f'{" good" if above else ""}">{esc(words)}</text>')  # fmt: skip
    if not rows:
        body.append(f'<text x="{width / 2:.0f}" y="{top + 20}" text-anchor="middle" '
                    'class="label">no variant has an interval</text>')  # fmt: skip
    return _svg(width, height, title, body, "interval-chart")


@dataclass
class Bars:
    name: str
    colour: str
    values: dict[str, float]


def bar_chart(categories: list[str], bars: list[Bars], *, title: str, metric: str,
              notes: dict[str, str] | None = None) -> str:  # fmt: skip
    """Grouped horizontal bars per category on a 0-1 axis; a missing value is left blank."""
    notes = notes or {}
    labels = [cat + (f" {notes[cat]}" if cat in notes else "") for cat in categories]
    # the names sit left of the axis, right-aligned: room for the longest (12.5 px text is
    # at most ~7.6 px a character), so a long class name is never cut at the chart's edge
    width, right, top = 1100, 60, 12
    left = int(min(max(190, 16 + 7.6 * max(map(len, labels), default=0)), width // 2))
    bar_h, gap = 15, 14
    group_h = bar_h * max(len(bars), 1) + gap
    height = top + group_h * max(len(categories), 1) + 40
    top_value = max([1.0] + [v for b in bars for v in b.values.values() if _finite(v)])
    f = Frame(width, height, 0.0, top_value, 0, 1, left=left, right=right, top=top)
    body: list[str] = []
    for t in nice_ticks(0.0, top_value, 5):
        x = f.x(t)
        body += _tick((x, x, top, height - 36), "grid", (x, height - 22), "middle", t)
    body.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 4}" '
                f'text-anchor="middle" class="label">{esc(metric)}</text>')  # fmt: skip
    for i, (cat, label) in enumerate(zip(categories, labels, strict=True)):
        y0 = top + i * group_h
        body.append(f'<text x="{left - 10}" y="{y0 + (group_h - gap) / 2 + 4:.1f}" '
                    f'text-anchor="end" class="name">{esc(label)}</text>')  # fmt: skip
        if not any(_finite(b.values.get(cat)) for b in bars):  # e.g. no validation example
            body.append(f'<text x="{left + 6}" y="{y0 + (group_h - gap) / 2 + 4:.1f}" '
                        'class="small">no score: no example to measure it on</text>')  # fmt: skip
        for j, b in enumerate(bars):
            v = b.values.get(cat)
            if not _finite(v):
                continue
            assert v is not None
            y = y0 + j * bar_h
            w = max(f.x(v) - left, 2.0)  # a zero still shows its colour as a stub
            body.append(f'<rect x="{left}" y="{y:.1f}" width="{w:.1f}" height="{bar_h - 2}" '
                        f'fill="{b.colour}" class="bar"><title>{esc(b.name)}, {esc(cat)}: '
                        f"{v:.3f}</title></rect>")  # fmt: skip
            body.append(f'<text x="{left + w + 4:.1f}" y="{y + bar_h - 4:.1f}" class="small">'
                        f"{v:.2f}</text>")  # fmt: skip
    return _svg(width, height, title, body, "bar-chart")


def legend(items: list[tuple[str, str, str]]) -> str:
    """An HTML legend: (name, colour, shape) with shape box, line, dash, cross or ring."""
    out = []
    for name, colour, shape in items:
        if shape == "cross":
            mark = (f'<svg width="14" height="14" aria-hidden="true"><path d="M2,2 l10,10 M2,12 '
                    f'l10,-10" stroke="{colour}" stroke-width="2.4"/></svg>')  # fmt: skip
        elif shape == "ring":
            mark = (f'<svg width="14" height="14" aria-hidden="true"><circle cx="7" cy="7" r="4.5" '
                    f'fill="white" stroke="{colour}" stroke-width="2"/></svg>')  # fmt: skip
        elif shape == "line":
            mark = (f'<svg width="22" height="10" aria-hidden="true"><line x1="0" x2="22" y1="5" '
                    f'y2="5" stroke="{colour}" stroke-width="2"/></svg>')  # fmt: skip
        elif shape == "dash":
            mark = (f'<svg width="22" height="10" aria-hidden="true"><line x1="0" x2="22" '
                    f'y1="5" y2="5" stroke="{colour}" stroke-width="2" '
                    'stroke-dasharray="6 3"/></svg>')  # fmt: skip
        else:
            mark = f'<span class="swatch" style="background:{colour}"></span>'
        out.append(f'<span class="legend-item">{mark}{esc(name)}</span>')
    return '<div class="legend">' + "".join(out) + "</div>"
