"""A sweep's trials ranked by the objective: rows, CSV and a page with their curves overlaid."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from pcflow.metrics.report import curve, fmt
from pcflow.metrics.svg import line_chart
from pcflow.readings.series import Objective

MAX_OVERLAID = 9


def rank_trials(documents: Sequence[Mapping[str, Any]], objective: Objective) -> list[dict[str, Any]]:
    """Best first; a trial without the objective (or diverged to NaN only) ranks last, unranked."""
    rows = []
    for doc in documents:
        obj = doc.get("objective") or {}
        rows.append(
            {
                "trial": doc["job"]["trial"],
                "outcome": doc["outcome"],
                "value": obj.get("value"),
                "final": obj.get("final"),
                "best_epoch": obj.get("best_epoch"),
                "elapsed_s": doc.get("elapsed_s"),
                "cost_usd_estimate": (doc.get("cost") or {}).get("total_usd"),
                "hyperparameters": doc["job"].get("hyperparameters") or {},
            }
        )
    sign = -1 if objective.mode == "max" else 1
    rows.sort(key=lambda r: (r["value"] is None, sign * r["value"] if r["value"] is not None else 0, r["trial"]))
    for position, row in enumerate(rows, start=1):
        row["rank"] = position if row["value"] is not None else None
    return rows


def leaderboard_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """The leaderboard as CSV: fixed columns, then one `hp.<name>` column per hyperparameter any trial had,
    values as JSON so types survive."""
    hp_keys = sorted({k for r in rows for k in r["hyperparameters"]})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    fixed = ["rank", "trial", "outcome", "value", "final", "best_epoch", "elapsed_s", "cost_usd_estimate"]
    writer.writerow(fixed + [f"hp.{k}" for k in hp_keys])
    for r in rows:
        hps = [json.dumps(r["hyperparameters"][k]) if k in r["hyperparameters"] else "" for k in hp_keys]
        writer.writerow(["" if r[c] is None else r[c] for c in fixed] + hps)
    return out.getvalue()


def leaderboard_page(
    rows: Sequence[Mapping[str, Any]], documents: Sequence[Mapping[str, Any]], objective: Objective, run_key: str
) -> str:
    """The leaderboard as one self-contained HTML page (the best trials' curves overlaid, then the table); every
    value from a trial is escaped."""
    by_trial = {doc["job"]["trial"]: doc for doc in documents}
    shown = [r["trial"] for r in rows][:MAX_OVERLAID]
    charts = []
    for name in dict.fromkeys([objective.name, "loss"]):
        overlay, label = {}, "step"
        for trial in shown:
            points = by_trial[trial].get("series", {}).get(name)
            if points:
                overlay[f"trial {trial}"], label = curve(points)
        charts.append(line_chart(overlay, title=f"{name} by trial", x_label=label))
    head = "".join(
        f"<th>{escape(h)}</th>" for h in ("rank", "trial", "outcome", objective.name, "final", "hyperparameters")
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{escape(fmt(v))}</td>"
            for v in (r["rank"], r["trial"], r["outcome"], r["value"], r["final"], json.dumps(r["hyperparameters"]))
        )
        + "</tr>"
        for r in rows
    )
    title = f"pcflow sweep {run_key}: {objective.name} ({objective.mode})"
    best = next((r for r in rows if r["value"] is not None), None)
    if best is None:
        best_html = f"<p>No trial reported {escape(objective.name)}: nothing to rank.</p>"
    else:
        best_html = (
            f"<p>Trial {best['trial']} ({escape(best['outcome'])}): {escape(objective.name)} "
            f"{escape(fmt(best['value']))}, with these hyperparameters:</p>"
            f"<pre>{escape(json.dumps(best['hyperparameters'], indent=2, sort_keys=True))}</pre>"
        )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        "<style>body{font-family:'DejaVu Sans',Arial,sans-serif;margin:24px}table{border-collapse:collapse;"
        "font-size:12px}td,th{border:1px solid #ddd;padding:4px 8px}.charts{display:flex;flex-wrap:wrap;gap:12px}"
        "pre{background:#f4f4f4;padding:8px;display:inline-block}"
        f"</style></head><body><h1>{escape(title)}</h1>"
        f"<h2>Best trial</h2><div id='best'>{best_html}</div><div class='charts'>{''.join(charts)}</div>"
        f"<table id='leaderboard'><tr>{head}</tr>{body}</table></body></html>"
    )
