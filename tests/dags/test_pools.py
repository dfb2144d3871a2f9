"""Pools bound spend across runs and DAGs: every pipeline DAG's cluster task and train task are in
pcflow's pools, teardowns in none (they must never wait for a slot), and the pools exist where pcflow
runs Airflow (created from include/pools.json by the prepare step)."""

from __future__ import annotations

import json

import pytest
from dagrun import POOLS_FILE, REPO

PIPELINE_DAGS = ("pretrain", "pretrain_nightly", "pretrain_sweep")


@pytest.fixture(scope="module")
def dags(airflow):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags


def test_cluster_and_train_tasks_take_a_pool_slot_and_teardowns_none(dags):
    for dag_id in PIPELINE_DAGS:
        pools = {task.task_id: task.pool for task in dags[dag_id].tasks}
        assert pools["cluster"] == "pcflow_clusters", dag_id
        assert pools["train"] == "pcflow_trials", dag_id
        teardowns = [t.task_id for t in dags[dag_id].tasks if t.is_teardown]
        assert all(pools[t] == "default_pool" for t in teardowns), dag_id
        # The nightly keeps its network and cluster for the next night: it gives back only its job account.
        kept = {"release_job_account"}
        assert set(teardowns) == (
            kept if dag_id == "pretrain_nightly" else kept | {"delete_cluster", "teardown", "release_network"}
        )


def test_every_pool_the_dags_use_exists_and_counts_deferred_tasks(dags):
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    used = {task.pool for dag in dags.values() for task in dag.tasks} - {"default_pool"}
    assert used == set(json.loads(POOLS_FILE.read_text()))
    with create_session() as session:
        for name in used:
            pool = session.query(Pool).filter(Pool.pool == name).one()  # made by prepare_airflow
            assert pool.slots >= 1 and pool.include_deferred, name
