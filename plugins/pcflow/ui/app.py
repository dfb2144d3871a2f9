"""The pcflow page: a FastAPI app the api-server mounts under `/pcflow` (pcflow_plugin.py, ui/mount.py).

Airflow does not authenticate a plugin's app by itself: every route here depends on Airflow's own
security helpers (the JWT of the `_token` cookie or an `Authorization: Bearer` header, checked by the
deployment's auth manager). The page shows only the DAGs the user may read, their runs' summaries only to
who may read that DAG's XComs (where they come from), and the stacks only to who may read the `janitor`
DAG (it is the janitor's view of them); a report needs read access to the run's XComs, where its
location comes from."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Annotated, Any

import jinja2
from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from pcflow.ui import reports, runs
from pcflow.urls import report_href, run_href

JANITOR_DAG = "janitor"
#: The page and the report are pcflow's own HTML with inline SVG and CSS: nothing may run or load.
PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'self'; form-action 'none'"
REPORT_CSP = f"{PAGE_CSP}; sandbox"
SAFE_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}

app = FastAPI(title="pcflow", docs_url=None, redoc_url=None, openapi_url=None)


@cache
def templates() -> jinja2.Environment:
    """The page's Jinja environment: autoescaped, strict about undefined names."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def html(body: str, csp: str = PAGE_CSP, status_code: int = 200) -> HTMLResponse:
    """An HTML response with the page's Content-Security-Policy and safe headers (nothing may run or load)."""
    return HTMLResponse(body, status_code, headers={"Content-Security-Policy": csp, **SAFE_HEADERS})


@app.get("/", response_class=HTMLResponse)
def page(user: GetUserDep, session: SessionDep) -> HTMLResponse:
    """Stacks and their resources, the runs of each training DAG, trends, leaderboards, the janitor."""
    manager = get_auth_manager()
    dags = visible_runs(manager, user, session)
    may_see_stacks = manager.is_authorized_dag(method="GET", details=DagDetails(id=JANITOR_DAG), user=user)
    return html(render_page(dags, stack_overview(session) if may_see_stacks else None))


def visible_runs(manager: Any, user: Any, session: Any) -> dict[str, list[runs.RunRow]]:
    """The runs of the training DAGs the user may read; a run's summary (objective, cost, report) only
    where the user may also read that DAG's XComs, which is where the summary comes from."""
    permitted = manager.get_authorized_dag_ids(user=user, method="GET", session=session)
    visible = {}
    for dag_id in runs.training_dag_ids(session, permitted):
        details = DagDetails(id=dag_id)
        summaries = manager.is_authorized_dag(
            method="GET", access_entity=DagAccessEntity.XCOM, details=details, user=user
        )
        visible[dag_id] = runs.recent_runs(session, dag_id, with_summaries=summaries)
    return visible


def stack_overview(session: Any) -> dict[str, Any]:
    """The resources' overview, or why there is none (the page still shows the runs)."""
    from pcflow.ui.resources import connection_clients, overview

    try:
        clients, region = connection_clients()
        return {"overview": overview(clients, region, run_state=runs.dag_run_state(session)), "error": None}
    except Exception as exc:  # an AWS outage or a missing connection must not hide the runs
        return {"overview": None, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def trend_charts(rows: list[runs.RunRow]) -> list[Markup]:
    """Two small charts of a DAG's last runs: the objective's best value, and the cost."""
    from pcflow.metrics.svg import line_chart

    points = runs.trend(rows)
    name = next((r.objective[0] for r in rows if r.objective[0]), "objective")
    series = ({name: points["objective"]}, f"{name} (best per run)"), ({"USD": points["cost"]}, "cost per run (USD)")
    return [Markup(line_chart(data, title=title, x_label="run", width=380, height=200)) for data, title in series]


def render_page(dags: dict[str, list[runs.RunRow]], stacks: dict[str, Any] | None) -> str:
    """The pcflow page's HTML for the DAGs and stacks the user may read (the caller has filtered them)."""
    from pcflow.metrics.report import fmt
    from pcflow.ui.resources import resource_summary

    return (
        templates()
        .get_template("page.html.j2")
        .render(
            dags=dags,
            charts={dag_id: trend_charts(rows) for dag_id, rows in dags.items()},
            leaderboards=[board for rows in dags.values() for board in runs.leaderboards(rows)],
            stacks=stacks,
            fmt=fmt,
            resource_summary=resource_summary,
            run_href=run_href,
            report_href=report_href,
        )
    )


@app.get(
    "/runs/{dag_id}/{run_id}/report",
    response_class=HTMLResponse,
    dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.XCOM))],
)
def report(
    dag_id: str, run_id: str, session: SessionDep, trial: Annotated[int | None, Query(ge=0, lt=10000)] = None
) -> HTMLResponse:
    """The run's report (a sweep: its leaderboard, or one trial's report) from its S3 copy, bounded, with
    a policy that forbids scripts."""
    found = runs.one_run(session, dag_id, run_id)
    location = runs.report_location(dag_id, run_id, found.summary if found else None, trial)
    if location is None:
        raise HTTPException(404, f"no report for {dag_id} {run_id}: its metrics task has not published one")
    try:
        return html(reports.read_report(*location), REPORT_CSP)
    except reports.ReportUnavailable as exc:
        raise HTTPException(exc.status, str(exc)) from exc
