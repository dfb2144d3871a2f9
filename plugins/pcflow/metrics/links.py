"""Buttons on the metrics task: its report, opened inside Airflow (the pcflow page serves the S3 copy,
pcflow.ui), and the stack's CloudWatch dashboard.

Airflow 3 renders extra links from XCom: the task pushes each URL under the link's `xcom_key` while
it runs, and `get_link` reads it back (no database or AWS call at render time)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperatorLink
from airflow.sdk.execution_time.xcom import XCom


class _XComLink(BaseOperatorLink):
    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return XCom.get_value(key=self.xcom_key, ti_key=ti_key) or ""

    @classmethod
    def persist(cls, context: Any, url: str) -> None:
        context["ti"].xcom_push(key=cls().xcom_key, value=url)


class MetricsReportLink(_XComLink):
    """The task's report, through the pcflow page inside Airflow (the viewer needs no access to S3)."""

    name = "Metrics report"


class MetricsDashboardLink(_XComLink):
    """The stack's CloudWatch dashboard in the AWS console."""

    name = "CloudWatch dashboard"
