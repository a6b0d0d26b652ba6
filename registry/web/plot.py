"""A small inline-SVG bar chart for difficulty profiles (no plotting library at request time)."""

from __future__ import annotations

from html import escape


def histogram_svg(counts: list[int], *, title: str = "", width: int = 420,
                  height: int = 180) -> str:
    """Bars of `counts` over pass-rate bins spanning [0, 1], with axis labels."""
    left, bottom, top = 36, 28, 22 if title else 8
    plot_w, plot_h = width - left - 8, height - bottom - top
    peak = max(counts) if counts and max(counts) > 0 else 1
    bar_w = plot_w / max(len(counts), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="histogram" role="img" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">']
    if title:
        parts.append(f'<text x="{left}" y="14" class="title">{escape(title)}</text>')
    for i, count in enumerate(counts):
        h = plot_h * count / peak
        x, y = left + i * bar_w + 1, top + plot_h - h
        lo, hi = i / len(counts), (i + 1) / len(counts)
        parts.append(f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bar_w - 2:.1f}" '
                     f'height="{h:.1f}"><title>{count} tasks with pass rate in '
                     f'[{lo:.1f}, {hi:.1f}{"]" if i == len(counts) - 1 else ")"}</title></rect>')
    axis_y = top + plot_h
    parts.append(f'<line x1="{left}" y1="{axis_y}" x2="{left + plot_w}" y2="{axis_y}" '
                 'class="axis"/>')
    for frac in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{left + frac * plot_w:.1f}" y="{axis_y + 16}" '
                     f'text-anchor="middle">{frac:g}</text>')
    parts.append(f'<text x="{left - 4}" y="{top + 10}" text-anchor="end">{peak}</text>')
    parts.append(f'<text x="{left - 4}" y="{axis_y}" text-anchor="end">0</text>')
    parts.append("</svg>")
    return "".join(parts)
