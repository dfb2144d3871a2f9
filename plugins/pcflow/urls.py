"""Where the pcflow page and a run's report live, as URLs: relative ones for the page itself (it works
under any `[api] base_url`), and the report's path under the deployment's base for the extra link.

A foundation module: the page (`pcflow.ui`) builds its links with it, and so does the harvest's extra
link (`pcflow.metrics.operators`), which therefore need not import the page."""

from __future__ import annotations

from urllib.parse import quote, urlsplit

URL_PREFIX = "/pcflow"


def _part(text: str) -> str:
    return quote(text, safe="")


def run_href(dag_id: str, run_id: str) -> str:
    """The run's view in Airflow's UI, relative to the page (`<base>/pcflow/`)."""
    return f"../dags/{_part(dag_id)}/runs/{_part(run_id)}"


def report_href(dag_id: str, run_id: str, trial: int | None = None) -> str:
    """The run's report (a sweep: its leaderboard, or one trial's report), relative to the page."""
    href = f"runs/{_part(dag_id)}/{_part(run_id)}/report"
    return href if trial is None else f"{href}?trial={int(trial)}"


def report_path(dag_id: str, run_id: str, base_url: str | None = None) -> str:
    """The report's absolute path on the api-server, under the path of `[api] base_url`."""
    if base_url is None:
        from airflow.configuration import conf

        base_url = conf.get("api", "base_url", fallback="") or ""
    base = urlsplit(base_url).path.rstrip("/")
    return f"{base}{URL_PREFIX}/{report_href(dag_id, run_id)}"
