"""Representative bad input from each stage, as the stage's own code meets it: each case calls what the
stage's task calls (the first task's checks, the network, image, dataset, cluster, train, metrics,
teardown and approval code, a connection's check) with one wrong setting. `test_input_errors.py` checks
each raises pcflow's input family naming the setting and who may change it, and runs each as an Airflow
task (`input_error_dags/`) to see Airflow fail it without a retry.

Nothing here reaches AWS or Slurm: every case is refused before a call is made.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from taskcontext import make_context

#: The words errors.py gives each owner (errors.profile_admin, trigger_user, profile_setting,
#: connection_admin, deployment_admin, task_author): every refusal ends with one of them.
OWNER_WORDS = (
    "only the deployment admin may change this (profile 'local')",
    "a trigger user may change this, within the bounds profile 'local' sets",
    "a trigger user may change this, within the bounds the run's profile sets",
    "the deployment admin sets this in the run's profile",
    "only the deployment admin may change this (Airflow connection ",
    "only the deployment admin may change this (an environment variable",
    "the DAG's author sets this (an argument of task ",
    "pcflow sets this itself",  # a hyperparameter pcflow adds (runspec.RESERVED_HYPERPARAMETERS): nobody else may
)


@dataclass(frozen=True)
class Case:
    name: str  # also the task id of the case in input_error_dags/
    stage: str
    setting: str  # the dotted path the message must name
    call: Callable[[], object]


def run_document(**changes: object):
    """The local profile planned as the first task hands it on (`PlannedRun`), with `changes` (run-spec
    sections) laid over it."""
    from pcflow.pipeline.settings import plan_run
    from pcflow.runspec import resolve_run_spec

    return plan_run(resolve_run_spec("local", changes), run_key="pretrain__input_errors", partition="default")


def conf_out_of_bounds() -> None:
    from pcflow.pipeline.settings import check_conf_fields

    check_conf_fields({"profile": "local", "nodes": 9})  # local allows 1-3


def conf_changes_an_admin_setting() -> None:
    from pcflow.pipeline.settings import check_conf_fields

    check_conf_fields({"profile": "local", "overrides": {"stack": "another"}})


def conf_removes_the_budget() -> None:
    from pcflow.pipeline.settings import check_conf_fields

    # issue 24: this ran with "(no budget)", skipping the profile's hard maximum and the in-run cancel
    check_conf_fields({"profile": "local", "partition": "p1", "overrides": {"budget": {"usd": None}}})


def trial_sets_pcflow_s_hyperparameter() -> None:
    from pcflow.pipeline.settings import check_conf_fields

    # issue 24: this reached the job's hparams.json as data_dir: /etc
    check_conf_fields({"profile": "local", "partition": "p1", "trials": [{"data_dir": "/etc"}]})


def schema_refuses_a_value() -> None:
    from pcflow.runspec import resolve_run_spec

    resolve_run_spec("local", {"training": {"nodes": 0}})


def sweep_too_large() -> None:
    from pcflow.pipeline.settings import expand_trials

    expand_trials([{"lr": 0.1}], {"seed": list(range(2000))})


def first_task_code_hyperparameters() -> None:
    from pcflow.checks import check_hyperparameters
    from pcflow.code.hparams import Case
    from pcflow.paths import include_dir

    code = {"dir": str(include_dir().parent / "examples" / "resnet")}  # its hparams.schema.json: depth in 14..152
    run = run_document(training={"payload": None, "code": code, "hyperparameters": {"depth": 13}})
    check_hyperparameters(run, [Case(run.training.hyperparameters)])


def first_task_network() -> None:
    run_document(network={"vpc_cidr": "10.0.0.0/33"})  # the run spec's `network` section is typed


def first_task_static_cluster() -> None:
    from pcflow.checks import check_static_cluster

    check_static_cluster(run_document(cluster={"provider": "static", "config": {"bogus": 1}}))


def network_stage_spec() -> None:
    from pcflow.aws.network_spec import NetworkSpec

    NetworkSpec.of("errors", "us-east-1", {"vpc_cidr": "10.0.0.0/8"})


def image_stage_script() -> None:
    from pcflow.aws.ami import load_script

    load_script("ami/no-such-recipe.sh")


def dataset_stage_partition() -> None:
    from pcflow.dataset.partition import resolve_partition

    resolve_partition({}, "../etc")


def train_stage_job() -> None:
    from pcflow.slurm.operators import SlurmJobOperator

    op = SlurmJobOperator(task_id="train", program=["train.py"], allocation={"nodes": 0}, deferrable=False)
    op.job_spec()


def train_stage_empty_sweep() -> None:
    from pcflow.slurm.operators import SlurmArrayJobOperator

    SlurmArrayJobOperator(task_id="train", program=["train.py"], trials=[], deferrable=False).array_spec()


def metrics_stage_objective() -> None:
    from pcflow.metrics.operators import HarvestMetricsOperator

    op = HarvestMetricsOperator(task_id="metrics", job={}, bucket="b", stack="errors")
    op.objective = {"name": "acc", "mode": "highest"}  # as a template renders it: known only when the task runs
    op.settings()


def teardown_stage_stack() -> None:
    from pcflow.aws.teardown.operators import TeardownOperator

    TeardownOperator(task_id="teardown", stack="").selector(make_context("teardown"))


def approval_by_the_trigger_user() -> None:
    from pcflow.approval import approvers_for

    approvers_for([{"name": "alice", "id": "alice"}], "alice")


def connection_without_a_pinned_key() -> None:
    from airflow.sdk import Connection

    from pcflow.slurm.head_node import HeadNode
    from pcflow.slurm.hook import head_node_connection

    conn_id = f"errors_{uuid.uuid4().hex[:6]}"
    conn = Connection(conn_id=conn_id, conn_type="ssh", host="h", extra='{"no_host_key_check": true}')
    head_node_connection(conn, HeadNode(conn_id))


CASES = [
    Case("conf_out_of_bounds", "validate", "training.nodes", conf_out_of_bounds),
    Case("conf_changes_an_admin_setting", "validate", "stack", conf_changes_an_admin_setting),
    Case("conf_removes_the_budget", "validate", "budget.usd", conf_removes_the_budget),
    Case(
        "trial_sets_pcflow_s_hyperparameter", "validate", "hyperparameters.data_dir", trial_sets_pcflow_s_hyperparameter
    ),
    Case("schema_refuses_a_value", "validate", "training.nodes", schema_refuses_a_value),
    Case("sweep_too_large", "validate", "trials", sweep_too_large),
    Case(
        "first_task_code_hyperparameters", "validate", "training.hyperparameters.depth", first_task_code_hyperparameters
    ),
    Case("first_task_network", "validate", "network.vpc_cidr", first_task_network),
    Case("first_task_static_cluster", "validate", "cluster.config", first_task_static_cluster),
    Case("network_stage_spec", "network", "network.vpc_cidr", network_stage_spec),
    Case("image_stage_script", "image", "ami.bootstrap_script", image_stage_script),
    Case("dataset_stage_partition", "dataset", "dataset.partition", dataset_stage_partition),
    Case("train_stage_job", "train", "resources.nodes", train_stage_job),
    Case("train_stage_empty_sweep", "train", "trials", train_stage_empty_sweep),
    Case("metrics_stage_objective", "metrics", "objective", metrics_stage_objective),
    Case("teardown_stage_stack", "teardown", "stack", teardown_stage_stack),
    Case("approval_by_the_trigger_user", "approve_cost", "budget.approvers", approval_by_the_trigger_user),
    Case("connection_without_a_pinned_key", "cluster", "host_key", connection_without_a_pinned_key),
]
