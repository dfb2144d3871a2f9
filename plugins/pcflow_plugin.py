"""Registers pcflow's operator extra links with Airflow (the rest of pcflow is a plain library)."""

from airflow.plugins_manager import AirflowPlugin

from pcflow.metrics.links import MetricsDashboardLink, MetricsReportLink


class PcflowPlugin(AirflowPlugin):
    name = "pcflow"
    operator_extra_links = [MetricsReportLink(), MetricsDashboardLink()]  # noqa: RUF012
