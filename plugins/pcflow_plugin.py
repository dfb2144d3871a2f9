"""Registers pcflow with Airflow: the metrics task's extra links, and the pcflow page (a FastAPI app the
api-server mounts under /pcflow, with an entry in the UI's navigation that shows it inside Airflow).
The rest of pcflow is a plain library."""

from airflow.plugins_manager import AirflowPlugin

from pcflow.metrics.links import MetricsDashboardLink, MetricsReportLink
from pcflow.ui.mount import LazyApp
from pcflow.urls import URL_PREFIX


class PcflowPlugin(AirflowPlugin):
    name = "pcflow"
    operator_extra_links = [MetricsReportLink(), MetricsDashboardLink()]  # noqa: RUF012
    fastapi_apps = [{"app": LazyApp("pcflow.ui.app:app"), "url_prefix": URL_PREFIX, "name": "pcflow"}]  # noqa: RUF012
    external_views = [  # noqa: RUF012
        {"name": "pcflow", "href": f"{URL_PREFIX}/", "destination": "nav", "url_route": "pcflow", "category": "browse"}
    ]
