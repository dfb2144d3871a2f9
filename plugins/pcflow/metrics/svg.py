"""A small, dependency-free line chart as inline SVG: the report stays one self-contained page."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        return [low]
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if m * step >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 1)]


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.2e}"


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    x_label: str = "step",
    width: int = 560,
    height: int = 260,
) -> str:
    """One polyline per series (NaN/inf points left out); an empty chart says so instead of drawing."""
    clean = {n: [(x, y) for x, y in pts if math.isfinite(x) and math.isfinite(y)] for n, pts in series.items()}
    clean = {n: pts for n, pts in clean.items() if pts}
    left, right, top, bottom = 56, 12, 28, 40 + 16 * ((len(clean) + 2) // 3)
    total_h = height + bottom - 40
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{total_h}" '
        f'viewBox="0 0 {width} {total_h}" role="img" aria-label="{escape(title)}">'
        f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13" font-weight="bold">{escape(title)}</text>'
    )
    if not clean:
        return head + f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#888">no data</text></svg>'
    xs = [x for pts in clean.values() for x, _ in pts]
    ys = [y for pts in clean.values() for _, y in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.05 or 1
        y0, y1 = y0 - pad, y1 + pad
    plot_w, plot_h = width - left - right, height - top - 40

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * plot_h

    parts = [head, f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>']
    for t in _ticks(y0, y1):
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 4}" y="{py(t) + 4:.1f}" text-anchor="end" font-size="10">{_fmt(t)}</text>')
    for t in _ticks(x0, x1):
        parts.append(
            f'<text x="{px(t):.1f}" y="{top + plot_h + 14}" text-anchor="middle" font-size="10">{_fmt(t)}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{top + plot_h + 28}" text-anchor="middle" font-size="11">'
        f"{escape(x_label)}</text>"
    )
    for i, (name, pts) in enumerate(clean.items()):
        color = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(pts))
        if len(pts) == 1:
            x, y = pts[0]
            parts.append(f'<circle class="series" cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        else:
            parts.append(
                f'<polyline class="series" data-name="{escape(name)}" points="{coords}" fill="none" '
                f'stroke="{color}" stroke-width="1.6"/>'
            )
        lx, ly = left + (i % 3) * (plot_w / 3), top + plot_h + 44 + 16 * (i // 3)
        parts.append(f'<rect x="{lx:.1f}" y="{ly - 8}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{lx + 14:.1f}" y="{ly + 1}" font-size="11">{escape(name[:40])}</text>')
    parts.append("</svg>")
    return "".join(parts)
