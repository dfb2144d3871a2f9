"""pcflow's AWS operators on one base that keeps the Amazon provider's contract (without importing the
provider's operator module at DAG parse time): the same constructor and template fields as its
`AwsBaseOperator`, TLS verification and botocore config reaching every client (the cluster providers'
and the pcluster CLI's too), and `deferrable` defaulting to Airflow's `operators.default_deferrable`."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest
from airflow.providers.amazon.aws.operators.base_aws import AwsBaseOperator
from airflow.providers.amazon.aws.utils.mixins import aws_template_fields as provider_template_fields
from stacktools import REPO

from pcflow.aws.ami import BakeImageOperator
from pcflow.aws.base import PcflowAwsOperator, aws_template_fields
from pcflow.aws.janitor import JanitorOperator
from pcflow.aws.network import DeleteNetworkOperator, EnsureNetworkOperator
from pcflow.aws.storage import FsxDataRepositoryTaskOperator
from pcflow.aws.teardown import TeardownOperator
from pcflow.cluster.idle import StopIdleFleetsOperator
from pcflow.cluster.operators import DeleteClusterOperator, EnsureClusterOperator, ValidateClusterConfigOperator
from pcflow.dataset.operators import DatasetLoadOperator
from pcflow.errors import TriggerEventError
from pcflow.metrics.operators import HarvestMetricsOperator, SweepLeaderboardOperator
from pcflow.slurm.operators import SlurmJobOperator

NETWORK = (EnsureNetworkOperator, DeleteNetworkOperator, TeardownOperator, JanitorOperator, StopIdleFleetsOperator)
CLUSTER = (ValidateClusterConfigOperator, EnsureClusterOperator, DeleteClusterOperator)
STAGES = (BakeImageOperator, FsxDataRepositoryTaskOperator, DatasetLoadOperator, HarvestMetricsOperator)
AWS_OPERATORS = (*NETWORK, *CLUSTER, *STAGES, SweepLeaderboardOperator)
#: Each deferrable operator, made with its required arguments only.
DEFERRABLE = {
    BakeImageOperator: {
        "stack": "s",
        "pcluster_version": "3.16.1",
        "bootstrap_script_path": "bootstrap.sh",
        "instance_profile": "p",
        "subnet_id": "subnet-1",
    },
    FsxDataRepositoryTaskOperator: {"file_system_id": "fs-1", "task_type": "export", "task_name": "export"},
    EnsureClusterOperator: {"provider": "static", "stack": "s"},
    DeleteClusterOperator: {"provider": "static", "stack": "s"},
    DatasetLoadOperator: {"source": "builtin:digits", "bucket": "b", "prefix": "p", "stack": "s"},
    SlurmJobOperator: {"program": ["train.py"]},
}
CONNECTION = ("aws_conn_id", "region_name", "verify", "botocore_config")


def keyword_defaults(function) -> dict:
    return {n: p.default for n, p in inspect.signature(function).parameters.items() if n in CONNECTION}


def test_the_base_keeps_the_providers_constructor_and_template_fields():
    assert keyword_defaults(PcflowAwsOperator.__init__) == keyword_defaults(AwsBaseOperator.__init__)
    assert PcflowAwsOperator.template_fields == AwsBaseOperator.template_fields
    assert aws_template_fields("stack", "b", "a") == provider_template_fields("stack", "b", "a")
    for operator in AWS_OPERATORS:
        assert issubclass(operator, PcflowAwsOperator), operator
        assert {"aws_conn_id", "region_name", "verify"} <= set(operator.template_fields), operator


def test_verify_and_botocore_config_reach_every_client(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    settings = {"aws_conn_id": None, "region_name": "eu-west-1", "verify": str(bundle)}
    config = {"connect_timeout": 7, "retries": {"mode": "adaptive"}}
    op = EnsureClusterOperator(task_id="c", provider="parallelcluster", stack="s", botocore_config=config, **settings)
    for client in (op.ec2, op.client("s3"), op.cluster_provider.clients("cloudformation")):
        assert client.meta.config.connect_timeout == 7 and client.meta.config.retries["mode"] == "adaptive"
        assert client.meta.region_name == "eu-west-1"
        assert client._endpoint.http_session._verify == str(bundle)
    assert op.cluster_provider.hook.aws_hook.verify == str(bundle)  # the pcluster CLI's AWS_CA_BUNDLE
    assert op.trigger_aws_kwargs["verify"] == str(bundle)
    assert op.trigger_aws_kwargs["botocore_config"]["connect_timeout"] == 7


def test_deferrable_defaults_to_airflows_operators_default_deferrable():
    for operator, required in DEFERRABLE.items():  # the tests' Airflow settings are pcflow's (dagrun.py): True
        assert operator(task_id="wait", **required).deferrable is True, operator
    probe = (
        "import inspect, json; from pcflow.aws.ami import BakeImageOperator as B;"
        "from pcflow.slurm.operators import SlurmJobOperator as S;"
        "print(json.dumps([inspect.signature(o.__init__).parameters['deferrable'].default for o in (B, S)]))"
    )
    env = {"AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "False", "PYTHONPATH": str(REPO / "plugins")}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == [False, False]


@pytest.mark.parametrize("operator", DEFERRABLE)
def test_every_resume_refuses_a_missing_or_malformed_event(operator):
    op = operator(task_id="wait", **DEFERRABLE[operator])
    for event in (None, "success", {"status": "done"}):
        with pytest.raises(TriggerEventError, match="wait resumed with"):
            op.execute_complete({}, event=event)
