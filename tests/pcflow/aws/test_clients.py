"""The default AWS connection id has one home, `pcflow.aws.clients.DEFAULT_AWS_CONN_ID`, and it is the
Amazon provider's own default (no stack needed)."""

from __future__ import annotations

from dagrun import REPO

from pcflow.aws.clients import DEFAULT_AWS_CONN_ID

LITERAL = '"aws_default"'


def test_the_default_connection_is_the_amazon_providers():
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    assert DEFAULT_AWS_CONN_ID == AwsBaseHook.default_conn_name


def test_the_default_connection_id_is_spelled_in_one_file():
    package = REPO / "plugins" / "pcflow"
    spelled = sorted(str(p.relative_to(package)) for p in package.rglob("*.py") if LITERAL in p.read_text())
    assert spelled == ["aws/clients.py"], f"use pcflow.aws.clients.DEFAULT_AWS_CONN_ID in {spelled}"
