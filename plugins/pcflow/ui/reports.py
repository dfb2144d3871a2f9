"""A run's report, read from its S3 copy for the page to serve inside Airflow: bounded in size, and only
as the HTML pcflow wrote (the page serves it with a policy that forbids scripts)."""

from __future__ import annotations

from typing import Any

from pcflow.aws.clients import error_code

#: pcflow's reports are tens to hundreds of KiB (inline SVG); more than this is not one of them.
MAX_REPORT_BYTES = 8 * 1024**2


class ReportUnavailable(Exception):
    """The report cannot be shown; `status` is the HTTP status that says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def read_report(bucket: str, key: str, s3: Any | None = None) -> str:
    """The report's text, at most MAX_REPORT_BYTES (one ranged GET: never more is read)."""
    if s3 is None:
        from pcflow.ui.resources import connection_clients

        s3 = connection_clients()[0]("s3")
    try:
        found = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{MAX_REPORT_BYTES}")
    except Exception as exc:
        if error_code(exc) in ("NoSuchKey", "404", "NoSuchBucket"):
            raise ReportUnavailable(404, f"s3://{bucket}/{key} does not exist (any more)") from exc
        raise
    with found["Body"] as body:
        data = body.read(MAX_REPORT_BYTES + 1)
    if len(data) > MAX_REPORT_BYTES:
        raise ReportUnavailable(413, f"s3://{bucket}/{key} is larger than {MAX_REPORT_BYTES // 1024**2} MiB: not shown")
    return data.decode("utf-8", errors="replace")
