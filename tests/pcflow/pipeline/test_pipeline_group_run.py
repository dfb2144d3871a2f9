"""The pipeline as a task group in a DAG of someone else's (host_dags/training_host.py), run end to end
on the local stack: the host's tasks run before and after the group's stages, the host's param stays
the host's, its last task reads the group's metrics through XCom, and the group's teardown leaves
nothing of the run behind."""

from __future__ import annotations

from pathlib import Path

from dagrun import remove_stack, run_dag, tagged_resources

from pcflow.naming import run_key

HOST_DAGS = Path(__file__).parent / "host_dags"
#: The shortest training the local profile allows: one epoch on one node.
CONF = {"partition": "hosted", "nodes": 1, "hyperparameters": {"epochs": 1}, "note": "release 7"}
STAGES = ("validate", "network", "dataset", "image", "cluster", "stage_in", "ship_payload", "train", "metrics")
TEARDOWNS = ("delete_cluster", "teardown", "release_network")


def test_a_host_dag_runs_the_group_between_its_own_tasks_and_leaves_nothing(airflow):
    try:
        result = run_dag("training_host", CONF, dag_folder=HOST_DAGS)
        assert result.state == "success", result.task_states
        assert {f"training.{stage}" for stage in STAGES + TEARDOWNS} < set(result.task_states)
        # Every task ran, the host's and the group's, but the cost approval (skipped below the threshold).
        others = {task: state for task, state in result.task_states.items() if state != "success"}
        assert others == {"training.approve_cost": "skipped"}, result.task_states
        out = result.returned
        settings = out["training.validate"]
        assert out["extract"] == "release 7" and "note" not in settings  # the host's param, not the group's
        assert settings["training"]["nodes"] == 1 and settings["dataset"]["partition"] == "hosted"
        assert out["training.train"]["state"] == "COMPLETED"
        metrics = out["training.metrics"]
        assert out["publish"] == {"note": "release 7", "objective": metrics["objective"], "report": metrics["report"]}
        assert metrics["objective"]["name"] == "fewshot_accuracy" and metrics["objective"]["value"] is not None
        key = settings["run_key"]
        assert key == run_key("training_host", result.run_id)
        assert not out["training.teardown"]["remaining"] and out["training.release_network"]["network_deleted"]
        assert tagged_resources("pcflow:run", key) == []
    finally:
        assert remove_stack("local") == []  # what the run keeps on purpose (image, data bucket)
