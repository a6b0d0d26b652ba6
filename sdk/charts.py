"""Inline SVG charts for every HTML page Corral writes: run reports (`corral report`, a training
run's `report.html`), evaluations (`eval.html`) and the registry's web catalog.

Charts are strings of SVG put straight into the page: a report is one self-contained file that
can be replaced atomically while a run writes it, draws without a plotting library, and stays
fast in a browser because every chart is aggregated before it is drawn (a line has at most
`MAX_POINTS` points; timelines are bucketed by the caller). A chart with nothing to draw is a
sentence saying why, never a blank box.
"""

from __future__ import annotations

import html
import math
from typing import Mapping, Sequence

__all__ = ["MAX_POINTS", "PALETTE", "Point", "STYLE", "bar_chart", "downsample", "empty",
           "line_chart", "stacked_bars", "ticks"]

PALETTE = ("#1e88e5", "#e53935", "#43a047", "#8e24aa", "#fb8c00", "#00897b", "#6d4c41",
           "#3949ab", "#c0ca33", "#546e7a")
MAX_POINTS = 400   # per line: more points than pixels only slow the browser down
WIDTH, HEIGHT = 560, 250
LEFT, RIGHT, TOP, BOTTOM = 58, 12, 26, 40

Point = tuple[float, float]


def empty(title: str, reason: str) -> str:
    """The placeholder of a chart with no data: its title and why it is empty."""
    return (f'<div class="empty"><b>{html.escape(title)}</b>: {html.escape(reason)}</div>')


def _fmt(value: float, step: float | None = None) -> str:
    """A tick or value label; with the tick `step`, just enough decimals to tell ticks apart."""
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.1e}"
    if step:
        return f"{value:.{max(0, min(4, -math.floor(math.log10(step))))}f}"
    return f"{value:.3g}"


def ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1-2-5 steps)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def downsample(points: Sequence[Point], limit: int = MAX_POINTS) -> list[Point]:
    """At most `limit` points: consecutive points are averaged in equal-count buckets."""
    if len(points) <= limit:
        return list(points)
    size = len(points) / limit
    out = []
    for i in range(limit):
        chunk = points[int(i * size):max(int((i + 1) * size), int(i * size) + 1)]
        out.append((sum(p[0] for p in chunk) / len(chunk), sum(p[1] for p in chunk) / len(chunk)))
    return out


def _step(values: Sequence[float]) -> float | None:
    return values[1] - values[0] if len(values) > 1 else None


class _Frame:
    """Axes of one chart: data-to-pixel mapping, grid, tick labels and titles."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], *, zero: bool = False) -> None:
        self.x0, self.x1 = min(xs), max(xs)
        if self.x1 == self.x0:
            self.x0, self.x1 = self.x0 - 0.5, self.x1 + 0.5
        lo, hi = min(ys), max(ys)
        if zero:
            lo = min(lo, 0.0)
        pad = (hi - lo) * 0.05 or abs(hi) * 0.1 or 1.0
        self.y0, self.y1 = lo - (0 if zero and lo == 0 else pad), hi + pad

    def x(self, value: float) -> float:
        return LEFT + (value - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        return HEIGHT - BOTTOM - (value - self.y0) / (self.y1 - self.y0) * (HEIGHT - TOP - BOTTOM)

    def axes(self, title: str, xlabel: str, ylabel: str) -> list[str]:
        out = [f'<text x="{WIDTH / 2}" y="16" class="t">{html.escape(title)}</text>']
        yt, xt = ticks(self.y0, self.y1), ticks(self.x0, self.x1, 6)
        for v in yt:
            y = self.y(v)
            out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                       'class="g"/>')
            out.append(f'<text x="{LEFT - 4}" y="{y + 3:.1f}" class="yl">'
                       f'{_fmt(v, _step(yt))}</text>')
        for v in xt:
            x = self.x(v)
            out.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 14}" class="xl">'
                       f'{_fmt(v, _step(xt))}</text>')
        out.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" class="a"/>')
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{HEIGHT - BOTTOM}" '
                   f'y2="{HEIGHT - BOTTOM}" class="a"/>')
        out.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 6}" class="t2">'
                   f'{html.escape(xlabel)}</text>')
        out.append(f'<text x="12" y="{(TOP + HEIGHT - BOTTOM) / 2}" class="t2" '
                   f'transform="rotate(-90 12 {(TOP + HEIGHT - BOTTOM) / 2})">'
                   f'{html.escape(ylabel)}</text>')
        return out


def _legend(names: Sequence[str], colors: Sequence[str]) -> str:
    items = "".join(f'<span><i style="background:{c}"></i>{html.escape(n)}</span>'
                    for n, c in zip(names, colors))
    return f'<div class="legend">{items}</div>'


def _svg(body: list[str], legend: str, name: str) -> str:
    return (f'<figure class="chart" data-chart="{html.escape(name)}"><svg viewBox="0 0 {WIDTH} '
            f'{HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img">{"".join(body)}</svg>'
            f'{legend}</figure>')


def line_chart(series: Mapping[str, Sequence[Point]], *, title: str, xlabel: str,
               ylabel: str, why_empty: str, colors: Mapping[str, str] | None = None,
               markers: bool = False) -> str:
    """Lines (one per named series of (x, y) points; non-finite points are skipped), or the
    `why_empty` sentence when no series has a point."""
    clean = {name: downsample([(float(x), float(y)) for x, y in pts
                               if math.isfinite(float(x)) and math.isfinite(float(y))])
             for name, pts in series.items()}
    clean = {name: pts for name, pts in clean.items() if pts}
    if not clean:
        return empty(title, why_empty)
    frame = _Frame([p[0] for pts in clean.values() for p in pts],
                   [p[1] for pts in clean.values() for p in pts])
    body = frame.axes(title, xlabel, ylabel)
    names = list(clean)
    palette = [(colors or {}).get(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)]
    for (name, pts), color in zip(clean.items(), palette):
        path = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in pts)
        body.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                    'stroke-width="1.8"/>')
        if markers or len(pts) == 1:
            body.extend(f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="3" '
                        f'fill="{color}"/>' for x, y in pts)
    return _svg(body, _legend(names, palette), title)


def stacked_bars(edges: Sequence[float], stacks: Mapping[str, Sequence[float]], *, title: str,
                 xlabel: str, ylabel: str, why_empty: str,
                 colors: Mapping[str, str] | None = None) -> str:
    """Bars over bins `edges[i]..edges[i+1]`, each stacked from the named series in order (a
    per-bucket view that stays readable at any number of underlying events)."""
    names = [n for n, vals in stacks.items() if any(v > 0 for v in vals)]
    if len(edges) < 2 or not names:
        return empty(title, why_empty)
    bins = len(edges) - 1
    totals = [sum(stacks[n][i] for n in names) for i in range(bins)]
    frame = _Frame([edges[0], edges[-1]], [0.0, max(totals)], zero=True)
    body = frame.axes(title, xlabel, ylabel)
    palette = [(colors or {}).get(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)]
    for i in range(bins):
        x0, x1 = frame.x(edges[i]), frame.x(edges[i + 1])
        base = 0.0
        for name, color in zip(names, palette):
            value = stacks[name][i]
            if value <= 0:
                continue
            top, bottom = frame.y(base + value), frame.y(base)
            body.append(f'<rect x="{x0:.1f}" y="{top:.1f}" width="{max(x1 - x0 - 0.3, 0.5):.1f}"'
                        f' height="{max(bottom - top, 0.3):.1f}" fill="{color}"/>')
            base += value
    return _svg(body, _legend(names, palette), title)


def bar_chart(labels: Sequence[str], values: Sequence[float], *, title: str, xlabel: str,
              ylabel: str, why_empty: str, color: str = PALETTE[0]) -> str:
    """One bar per label (a histogram of pre-counted bins); `why_empty` when all are zero."""
    if not values or not any(v > 0 for v in values):
        return empty(title, why_empty)
    frame = _Frame([0.0, float(len(values))], [0.0, max(values)], zero=True)
    body = [line for line in frame.axes(title, xlabel, ylabel) if 'class="xl"' not in line]
    step = max(1, math.ceil(len(labels) / 8))  # labels never overlap
    for i, (label, value) in enumerate(zip(labels, values)):
        x0, x1 = frame.x(i), frame.x(i + 1)
        body.append(f'<rect class="bar" x="{x0 + 1:.1f}" y="{frame.y(value):.1f}" '
                    f'width="{max(x1 - x0 - 2, 0.5):.1f}" '
                    f'height="{frame.y(0) - frame.y(value):.1f}" fill="{color}">'
                    f'<title>{html.escape(label)}: {_fmt(value)}</title></rect>')
        if i % step == 0:
            body.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{HEIGHT - BOTTOM + 14}" class="xl">'
                        f'{html.escape(label)}</text>')
    return _svg(body, "", title)


STYLE = """
.chart{display:inline-block;margin:0 12px 14px 0;vertical-align:top}
.chart svg{background:#fff;border:1px solid #ddd}
.chart text{font:10px sans-serif;fill:#333}.chart .t{font-size:12px;font-weight:bold;
text-anchor:middle}.chart .t2{font-size:11px;text-anchor:middle}.chart .yl{text-anchor:end}
.chart .xl{text-anchor:middle}.chart .g{stroke:#eee}.chart .a{stroke:#888}
.legend{font:11px sans-serif;max-width:560px}.legend span{margin-right:10px;white-space:nowrap}
.legend i{display:inline-block;width:10px;height:10px;margin-right:3px;vertical-align:middle}
.empty{display:inline-block;margin:0 12px 14px 0;padding:10px;border:1px dashed #bbb;
color:#555;max-width:540px;font-size:13px}
"""
