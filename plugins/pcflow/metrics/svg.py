"""A small, dependency-free line chart as inline SVG: the report stays one self-contained page."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Frame:
    """The plot area (pixels) and the data range it shows."""

    left: float
    top: float
    width: float
    height: float
    x0: float
    x1: float
    y0: float
    y1: float

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * self.width

    def py(self, y: float) -> float:
        return self.top + (1 - (y - self.y0) / (self.y1 - self.y0)) * self.height


def _frame(points: Mapping[str, Sequence[tuple[float, float]]], **area: float) -> _Frame:
    """The data's range, widened where it is a single value (so nothing divides by zero)."""
    xs = [x for pts in points.values() for x, _ in pts]
    ys = [y for pts in points.values() for _, y in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.05 or 1
        y0, y1 = y0 - pad, y1 + pad
    return _Frame(x0=x0, x1=x1, y0=y0, y1=y1, **area)


def _axes(f: _Frame, x_label: str) -> list[str]:
    parts = [f'<rect x="{f.left}" y="{f.top}" width="{f.width}" height="{f.height}" fill="none" stroke="#ccc"/>']
    for t in _ticks(f.y0, f.y1):
        y = f.py(t)
        parts.append(f'<line x1="{f.left}" x2="{f.left + f.width}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{f.left - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10">{_fmt(t)}</text>')
    for t in _ticks(f.x0, f.x1):
        parts.append(
            f'<text x="{f.px(t):.1f}" y="{f.top + f.height + 14}" text-anchor="middle" font-size="10">{_fmt(t)}</text>'
        )
    parts.append(
        f'<text x="{f.left + f.width / 2}" y="{f.top + f.height + 28}" text-anchor="middle" font-size="11">'
        f"{escape(x_label)}</text>"
    )
    return parts


def _series(f: _Frame, points: Mapping[str, Sequence[tuple[float, float]]]) -> list[str]:
    """Each series' line (a dot when it has one point) and its legend entry, three to a legend row."""
    parts = []
    for i, (name, pts) in enumerate(points.items()):
        color = PALETTE[i % len(PALETTE)]
        if len(pts) == 1:
            x, y = pts[0]
            parts.append(f'<circle class="series" cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="3" fill="{color}"/>')
        else:
            coords = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in sorted(pts))
            parts.append(
                f'<polyline class="series" data-name="{escape(name)}" points="{coords}" fill="none" '
                f'stroke="{color}" stroke-width="1.6"/>'
            )
        lx, ly = f.left + (i % 3) * (f.width / 3), f.top + f.height + 44 + 16 * (i // 3)
        parts.append(f'<rect x="{lx:.1f}" y="{ly - 8}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{lx + 14:.1f}" y="{ly + 1}" font-size="11">{escape(name[:40])}</text>')
    return parts


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
    frame = _frame(clean, left=left, top=top, width=width - left - right, height=height - top - 40)
    return "".join([head, *_axes(frame, x_label), *_series(frame, clean), "</svg>"])
