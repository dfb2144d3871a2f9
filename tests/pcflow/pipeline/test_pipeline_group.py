"""The pipeline as a task group in someone else's DAG: the same stages, wired the same way as in the
pipeline's own DAGs, between the host's tasks; each stage reads its own group's results, and the host's
own params are left to the host."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException

from pcflow.pipeline import (
    STAGE_TIMEOUTS,
    TRAINING_DAG_ARGS,
    build_training_pipeline,
    training_params,
)
from pcflow.pipeline.settings import check_conf_fields
from pcflow.pipeline.validation import training_form


def host_dag() -> DAG:
    """The worked example: host_dags/training_host.py (test_pipeline_group_run.py runs it end to end)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(Path(__file__).parent / "host_dags"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["training_host"]


def shape(tasks, prefix: str = "") -> dict[str, tuple]:
    """Each of the pipeline's tasks by its name in the pipeline: its upstream names among them, trigger
    rule, pool, retries, timeout, setup/teardown, operator."""
    return {
        task.task_id.removeprefix(prefix): (
            sorted(up.removeprefix(prefix) for up in task.upstream_task_ids if up.startswith(prefix)),
            str(task.trigger_rule),
            task.pool,
            task.retries,
            task.execution_timeout,
            task.is_setup,
            task.is_teardown,
            type(task).__name__,
        )
        for task in tasks
        if task.task_id.startswith(prefix)
    }


@pytest.fixture(scope="module")
def dags() -> tuple[DAG, DAG]:
    with DAG("pretrain", schedule=None, params=training_params(partition="default"), **TRAINING_DAG_ARGS) as own:
        build_training_pipeline(run_scoped=True)
    return own, host_dag()


def test_the_group_declares_the_pipeline_as_its_own_dag_does(dags):
    own, host = dags
    assert shape(host.tasks, "training.") == shape(own.tasks)


def test_the_hosts_tasks_come_before_and_after_and_keep_their_own_settings(dags):
    _, host = dags
    extract, publish = host.get_task("extract"), host.get_task("publish")
    assert extract.downstream_task_ids == {"training.validate"}
    # After the work; the teardowns still run after a failure, and do not hold the host's next task.
    assert publish.upstream_task_ids == {"training.metrics"}
    assert host.get_task("training.teardown").upstream_task_ids >= {"training.delete_cluster"}
    assert extract.execution_timeout is None and publish.retries == 0  # the group's defaults are its own
    assert host.get_task("training.network").execution_timeout == STAGE_TIMEOUTS["network"]


def test_a_stage_reads_its_own_groups_results(dags):
    _, host = dags
    task = host.get_task("training.dataset")
    returned = {
        "training.validate": {
            **{"dataset": {"bucket": "b", "prefix": "p", "partition": "x", "mode": "m", "fsx_owner": None}},
            **{"stack": "s", "region": "eu-west-1"},
        },
        "training.dataset_source": "/data",
        "training.validate_cluster": {},
    }

    class TI:
        _upstream_map_indexes: dict = {}  # noqa: RUF012 - read by Airflow's XComArg.resolve

        def xcom_pull(self, task_ids: str, key: str = "return_value", **_: object):
            return returned[task_ids]

    task.render_template_fields({"ti": TI(), "task": task, "params": {}})
    assert (task.bucket, task.prefix, task.stack, task.source) == ("b", "p", "s", "/data")
    assert task.region_name == "eu-west-1"


def test_the_hosts_params_are_its_own_and_any_other_conf_is_refused(dags):
    _, host = dags
    params = {"profile": "local", "note": "v2", "nodes": 1}
    assert training_form(params, host) == {"profile": "local", "nodes": 1}
    with pytest.raises(AirflowFailException, match="bogus: not a field"):
        check_conf_fields(training_form({**params, "bogus": 1}, host))


def test_a_dag_file_using_the_group_parses_and_serialises(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    (tmp_path / "host.py").write_text(
        textwrap.dedent(
            """
        from airflow.providers.standard.operators.empty import EmptyOperator
        from airflow.sdk import DAG

        from pcflow.pipeline import sweep_params, training_params, training_pipeline_group

        with DAG("host_sweep", schedule=None, params=training_params(extra=sweep_params())):
            EmptyOperator(task_id="extract") >> training_pipeline_group("sweep", sweep=True)
        """
        )
    )
    bag = DagBag(dag_folder=str(tmp_path))
    assert not bag.import_errors and set(bag.dag_ids) == {"host_sweep"}
    dag = bag.dags["host_sweep"]
    back = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    assert set(back.task_dict) == set(dag.task_dict) and "sweep.train" in back.task_dict
    assert type(dag.get_task("sweep.train")).__name__ == "SlurmArrayJobOperator"
