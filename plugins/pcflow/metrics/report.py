"""The run's report: one self-contained HTML page (inline SVG plots, no scripts, no remote assets)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import jinja2
from markupsafe import Markup

from pcflow.metrics.svg import line_chart

MAX_METRIC_CHARTS = 12


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("pcflow.metrics", "templates"),
        undefined=jinja2.ChainableUndefined,
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def fmt(value: Any) -> str:
    """A value as the report shows it: a dash for nothing, four significant digits without an exponent for numbers."""
    if value is None or value == "":
        return "—"
    if isinstance(value, float):  # 4 significant digits, but never an exponent for a large amount
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def curve(points: list[list[Any]]) -> tuple[list[tuple[float, float]], str]:
    """[[step, epoch, time, value], ...] -> (x, y) by step, else epoch, else order; and the x label."""
    if points and all(p[0] is not None for p in points):
        return [(p[0], p[3]) for p in points], "step"
    if points and all(p[1] is not None for p in points):
        return [(p[1], p[3]) for p in points], "epoch"
    return [(i, p[3]) for i, p in enumerate(points)], "report #"


def metric_charts(series: Mapping[str, list[list[Any]]]) -> list[str]:
    """One SVG line chart per metric series, at most MAX_METRIC_CHARTS, so a job with hundreds of metrics still
    gives a readable page."""
    charts = []
    for name, points in list(series.items())[:MAX_METRIC_CHARTS]:
        xy, label = curve(points)
        charts.append(line_chart({name: xy}, title=name, x_label=label))
    return charts


def utilisation_charts(timeline: Mapping[str, list[list[float]]]) -> list[str]:
    """GPU use and GPU memory (when the job saw GPUs: they differ in scale, so one chart each), CPU per node."""

    def pick(prefix: str) -> dict[str, list[tuple[float, float]]]:
        return {k: [tuple(p) for p in v] for k, v in timeline.items() if k.startswith(prefix)}

    charts = []
    if pick("gpu util"):
        charts.append(line_chart(pick("gpu util"), title="GPU use (% of one GPU, summed)", x_label="seconds"))
    if pick("gpu memory"):
        charts.append(line_chart(pick("gpu memory"), title="GPU memory used (%)", x_label="seconds"))
    charts.append(line_chart(pick("cpu"), title="CPU use per node (%)", x_label="seconds"))
    return charts


def render_report(document: Mapping[str, Any], *, title: str | None = None) -> str:
    """The run's report page from its harvest document; the template autoescapes, and only pcflow's own SVG is
    marked safe."""
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            doc=document,
            title=title or f"pcflow run {document.get('run_key', '')}",
            fmt=fmt,
            mib=lambda b: round(b / 1024**2, 1) if isinstance(b, int | float) else None,
            metric_charts=[Markup(c) for c in metric_charts(document.get("series", {}))],
            utilisation_charts=[Markup(c) for c in utilisation_charts(document.get("utilisation_timeline", {}))],
        )
    )
