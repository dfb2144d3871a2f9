"""pcflow's error family: bad input or configuration fails without retries, anything else is retried.

Each case of input_error_cases.py (one bad setting per stage: the first task's checks, network, image,
dataset, train, metrics, teardown, approval, a connection) raises a `PcflowInputError` whose message
names the setting and who may change it (errors.refusal's words). Run as Airflow tasks with a retry to
spare (`input_error_dags/`, dag.test on the local stack), each ends FAILED at its first try, while an
unreachable Slurm head node is retried and the retry reaches it."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException
from dagrun import run_dag
from input_error_cases import CASES, OWNER_WORDS

from pcflow.errors import PcflowError, PcflowInputError, ServiceFailed, WaitFailed, refusal, trigger_user
from pcflow.slurm.hook import SlurmConnectionError

DAGS = Path(__file__).parent / "input_error_dags"


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_of_each_stage_raises_the_family_naming_the_setting_and_its_owner(case):
    with pytest.raises(PcflowInputError) as refused:
        case.call()
    message = str(refused.value)
    assert isinstance(refused.value, AirflowFailException)  # Airflow's task runner: FAILED, no retry
    assert case.setting in message
    assert any(words in message for words in OWNER_WORDS), message


def test_infrastructure_errors_stay_retried():
    for error in (SlurmConnectionError, ServiceFailed, WaitFailed, PcflowError):
        assert not issubclass(error, AirflowFailException), error


def test_a_refusal_reads_path_problem_owner():
    assert refusal("training.nodes", "9 is above 3", trigger_user("local")) == (
        "training.nodes: 9 is above 3; a trigger user may change this, within the bounds profile 'local' sets"
    )


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # free once closed: nothing listens there


def tries(dag_id: str, run_id: str) -> dict[str, tuple[str, int]]:
    """Each task's final state and how many tries it took, from the metadata database."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        found = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
        )
        return {ti.task_id: (str(ti.state), ti.try_number) for ti in found}


@pytest.mark.usefixtures("airflow")
def test_airflow_fails_bad_input_at_once_and_retries_an_unreachable_head_node(monkeypatch):
    slurm = json.loads(os.environ["AIRFLOW_CONN_SLURM_DEFAULT"])
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_UNREACHABLE", json.dumps({**slurm, "port": closed_port()}))

    result = run_dag("input_error_retries", dag_folder=DAGS)

    outcome = tries("input_error_retries", result.run_id)
    assert {case.name: outcome[case.name] for case in CASES} == {case.name: ("failed", 1) for case in CASES}
    assert outcome["slurm_unreachable_then_reached"] == ("success", 2)  # try 1 refused, the retry reached it
    assert result.returned["slurm_unreachable_then_reached"]  # sinfo's partitions, from the real head node
