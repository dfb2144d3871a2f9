"""Values reach operators exactly as the first task validated them. Jinja's native rendering
literal-evaluates strings, so the training DAGs do not render natively and their operators take no
Jinja template at all: they get the validated document's values as data (`pcflow.values.Returned`).
Unit level (the DAGs parsed once, operators rendered against a validated document): about 5 s."""

from __future__ import annotations

import jinja2.nativetypes
import pytest
from dagrun import REPO

from pcflow.slurm.head_node import HeadNode
from pcflow.values import Returned

pytestmark = pytest.mark.security

TRAINING_DAGS = ("pretrain", "pretrain_nightly", "pretrain_sweep")
#: Strings that native rendering turns into something else: a path, numbers, None.
RETYPED = {
    "'..''/''..''/home'": "../../home",
    "20261129": 20261129,
    "1e5": 100000.0,
    "0x10": 16,
    "None": None,
}


class ReturnedValues:
    """A task instance whose upstream tasks returned `returned` ({task_id: value})."""

    _upstream_map_indexes: dict = {}  # noqa: RUF012 - read by Airflow's XComArg.resolve

    def __init__(self, returned: dict):
        self.returned = returned

    def xcom_pull(self, task_ids: str, key: str = "return_value", **_: object):
        value = self.returned[task_ids]
        return value if key == "return_value" else value[key]


@pytest.fixture(scope="module")
def dags():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    return {dag_id: bag.dags[dag_id] for dag_id in TRAINING_DAGS}


def test_native_rendering_would_change_these_values():
    """Why: what the DAGs rendered before, shown on the values themselves."""
    template = jinja2.nativetypes.NativeEnvironment().from_string("{{ value }}")
    for text, becomes in RETYPED.items():
        assert template.render(value=text) == becomes


def jinja_strings(value):
    if isinstance(value, str):
        return [value] if "{{" in value or "{%" in value else []
    if isinstance(value, dict):
        return [s for v in value.values() for s in jinja_strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in jinja_strings(v)]
    return []


def test_no_operator_of_a_training_dag_renders_a_jinja_template(dags):
    for dag_id, dag in dags.items():
        assert dag.render_template_as_native_obj is False, dag_id
        for task in dag.tasks:
            for field in task.template_fields:
                assert jinja_strings(getattr(task, field)) == [], (dag_id, task.task_id, field)


@pytest.mark.parametrize("partition", ["20261129", "1e5", "0x10", "None"])
def test_the_dataset_stage_gets_the_partition_and_prefix_as_validated(dags, offline, admin_profiles, partition):
    profile = admin_profiles.make("local", {"dataset": {"prefix": "'..''/''..''/home'"}})
    run = offline({"profile": profile, "partition": partition})
    assert run["dataset"]["partition"] == partition and run["dataset"]["prefix"] == "'..''/''..''/home'"
    task = rendered(dags["pretrain"], "dataset", {"validate": run, "dataset_source": "/data", "validate_cluster": {}})
    assert task.partition == partition and task.prefix == "'..''/''..''/home'" and task.source == "/data"
    assert task.fsx_file_system_id is None  # no cluster existed before the run


def test_the_train_task_gets_its_job_as_validated(dags, offline, form, admin_profiles, schemaless_payload):
    training = {"env": {"MODE": "0x10", "EMPTY": "None"}, "payload": schemaless_payload}
    profile = admin_profiles.make("local", {"training": training})
    conf = {"profile": profile, "partition": "p1", "hyperparameters": {"tag": "1e5"}}
    run = offline(conf)
    inputs = {
        "head_node": {"conn_id": "slurm_default", "address": None, "host_key": None},
        "shared_root": "/shared",
        "hyperparameters": {**run["training"]["hyperparameters"], "data_dir": "/shared/20261129"},
        "trials": [],
        "fabric_env": {"FI_PROVIDER": "efa"},  # what the cluster's network needs (an EFA cluster's)
    }
    digest = "0123456789abcdef0123"
    shipped = {"name": "simclr", "digest": digest, "dir": f"/shared/pcflow/payloads/{digest}"}
    prepared = {"id": "e" * 20, "python": f"/shared/pcflow/envs/{'e' * 20}/bin/python", "built": False}
    image = {"reference": None, "digest": None, "imported": False, "python": prepared["python"]}  # no container
    returned = {"validate": run, "training_inputs": inputs, "ship_payload": shipped, "prepare_environment": prepared}
    warm = {**run["warm_start"], "path": "/shared/pcflow/runs/k/warm_start/model.pt"}
    task = rendered(
        dags["pretrain"], "train", {**returned, "prepare_image": image, "warm_start": warm}, params=form(conf)
    )
    assert task.payload_dir == shipped["dir"]
    assert task.warm_start == warm["path"]  # the warm_start task's path on the cluster, as it returned it
    assert task.python == prepared["python"]  # the run's own environment's, not training.python
    assert task.container == image  # no container: on the nodes themselves
    assert task.env == {"MODE": "0x10", "EMPTY": "None"}
    assert task.hyperparameters["tag"] == "1e5" and task.hyperparameters["data_dir"] == "/shared/20261129"
    assert task.allocation == run["training"]["allocation"] and task.program == run["training"]["program"]
    assert isinstance(task.max_restarts, int) and task.early_stopping is None
    assert task.fabric_env == {"FI_PROVIDER": "efa"} and task.capacity == run["capacity_order"]
    assert HeadNode.of(task.head_node) == HeadNode("slurm_default")  # one value, from the cluster's XCom


def test_a_missing_optional_value_is_none():
    missing = Returned("validate_cluster", ("existing", "file_system_ids", 0), optional=True)
    for returned in ({}, {"existing": None}, {"existing": {"file_system_ids": []}}):
        assert missing.resolve({"ti": ReturnedValues({"validate_cluster": returned})}) is None
    found = {"existing": {"file_system_ids": ["fs-1"]}}
    assert missing.resolve({"ti": ReturnedValues({"validate_cluster": found})}) == "fs-1"


def rendered(dag, task_id: str, returned: dict, params: dict | None = None):
    """The task's fields rendered as a worker renders them before `execute`."""
    import copy

    task = copy.copy(dag.get_task(task_id))
    task.render_template_fields({"ti": ReturnedValues(returned), "params": params or {}})
    return task
