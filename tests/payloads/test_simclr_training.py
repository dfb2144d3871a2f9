"""The SimCLR payload trained for real: submitted by SlurmJobOperator to the local Slurm, two srun
tasks meeting in a gloo process group, in the payload's own venv, on the digits."""

from __future__ import annotations

import importlib
import json
import threading
import time
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred
from stacktools import LocalStack
from taskcontext import first_event, make_context

from pcflow.dataset.digits import materialize_digits
from pcflow.jobstates import JobState
from pcflow.slurm.hook import SlurmHook
from pcflow.slurm.operators import SlurmJobOperator

pytestmark = pytest.mark.stack

FAST = {"poll_interval": 0.2, "confirm_interval": 2.0}
TRAIN = Path(__file__).resolve().parents[2] / "examples" / "simclr" / "train.py"
CHANCE = 0.1  # ten digit classes
#: How much better the few-label probe (one label per class) does on the trained encoder than on the
#: same encoder untrained, after the profile's 5 epochs: +0.136..+0.219 measured over seeds 0-4 (two
#: tasks, batch 128); the full linear probe moves +0.004..+0.021 (examples/simclr/README.md).
MARGIN = 0.08


@pytest.fixture(scope="session")
def digits_dir(local_stack: LocalStack) -> Path:
    return materialize_digits(local_stack.shared_root / "tests" / "simclr-digits")


@pytest.fixture
def slurm(local_stack) -> SlurmHook:
    hook = SlurmHook()
    yield hook
    hook.close()


def simclr_op(task_id: str, python: Path, hyperparameters: dict, tasks: int = 2) -> SlurmJobOperator:
    return SlurmJobOperator(
        task_id=task_id,
        launcher="srun",
        program=[str(python), str(TRAIN)],
        python=str(python),
        allocation={"tasks_per_node": tasks, "time_limit": "10"},
        hyperparameters=hyperparameters,
        **FAST,
    )


def defer(op: SlurmJobOperator, context: dict):
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    classpath, kwargs = deferred.value.trigger.serialize()
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


def metrics_of(slurm: SlurmHook, result: dict) -> list[dict]:
    return [json.loads(line) for line in slurm.read_file(result["metrics_file"]).decode().splitlines()]


def exit_marker(slurm: SlurmHook, run_dir: str) -> dict:
    """The batch wrapper's record of how the job's program ended."""
    return json.loads(slurm.read_file(run_dir + "/exit.json"))


def values(metrics: list[dict], name: str) -> list[float]:
    return [m["value"] for m in metrics if m["name"] == name]


def assert_trained(slurm: SlurmHook, result: dict, epochs: int) -> list[dict]:
    metrics = metrics_of(slurm, result)
    for m in metrics:
        assert set(m) == {"time", "epoch", "step", "name", "value", "split"}, m
        assert m["split"] in {"train", "eval"} and isinstance(m["value"], float)
    assert {m["epoch"] for m in metrics if m["name"] == "loss"} == set(range(epochs))
    assert len(values(metrics, "throughput")) >= epochs
    (accuracy,) = values(metrics, "probe_accuracy")
    assert accuracy > 5 * CHANCE, f"probe accuracy {accuracy} is not well above chance ({CHANCE})"
    assert Path(result["run_dir"], "model.pt").is_file()  # the shared root is local in the embedded stack
    return metrics


def test_two_task_ddp_training_beats_the_untrained_encoder(slurm: SlurmHook, payload_python: Path, digits_dir: Path):
    op = simclr_op("simclr", payload_python, {"data_dir": str(digits_dir), "epochs": 5, "seed": 0})
    context = make_context("simclr")
    result = op.execute_complete(context, first_event(defer(op, context)))

    assert result["state"] == "COMPLETED" and result["exit_code"] == 0 and result["restarts"] == 0
    metrics = assert_trained(slurm, result, epochs=5)
    (trained,), (untrained,) = values(metrics, "fewshot_accuracy"), values(metrics, "fewshot_accuracy_untrained")
    assert trained > untrained + MARGIN, f"few-label probe: trained {trained}, untrained {untrained}"
    assert "resumed_from_epoch" not in {m["name"] for m in metrics}
    log = slurm.read_file(result["log"]).decode()
    assert log.count("joining gloo process group") == 2 and "2 task(s)" in log
    assert sorted(p.name for p in Path(result["run_dir"], "checkpoints").iterdir()) == [
        "epoch-0004.pt",
        "epoch-0004.pt.sha256.json",
        "epoch-0005.pt",
        "epoch-0005.pt.sha256.json",
    ]


def released(info, run_dir: str) -> bool:
    """Running its second attempt, or pending for another reason than the requeue hold (BeginTime)."""
    if "attempt 1 on" in Path(run_dir, "job.log").read_text(errors="replace"):
        return True
    return info is not None and info.state is JobState.PENDING and info.reason not in {"BeginTime", ""}


def test_requeued_training_resumes_from_its_last_checkpoint(slurm: SlurmHook, payload_python: Path, digits_dir: Path):
    op = simclr_op("simclr-requeue", payload_python, {"data_dir": str(digits_dir), "epochs": 3, "seed": 0})
    context = make_context("simclr-requeue")
    trigger = defer(op, context)
    requeued: dict = {}

    def requeue_after_first_checkpoint() -> None:
        watcher = SlurmHook()
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not Path(trigger.run_dir, "checkpoints", "epoch-0001.pt").is_file():
                time.sleep(0.2)
            watcher.requeue(trigger.job_id)
            requeued["at"] = time.monotonic()
            # Slurm holds a requeued job back (BeginTime, about two minutes) once its processes are gone,
            # which takes a few seconds: release it every second until it is no longer held that way.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                watcher.run(["scontrol", "update", f"JobId={trigger.job_id}", "StartTime=now"], check=False)
                if released(watcher.job_info(trigger.job_id), trigger.run_dir):
                    break
                time.sleep(1.0)
        finally:
            watcher.close()

    helper = threading.Thread(target=requeue_after_first_checkpoint)
    helper.start()
    event = first_event(trigger)
    helper.join()
    result = op.execute_complete(context, event)

    assert "at" in requeued and result["restarts"] == 1
    metrics = assert_trained(slurm, result, epochs=3)
    (resumed,) = values(metrics, "resumed_from_epoch")
    assert 1 <= resumed < 3
    after = metrics[[m["name"] for m in metrics].index("resumed_from_epoch") :]
    assert min(m["epoch"] for m in after if m["name"] == "loss") == resumed  # no epoch trained twice
    log = slurm.read_file(result["log"]).decode()
    assert f"resumed from {trigger.run_dir}/checkpoints/epoch-{int(resumed):04d}.pt" in log


def test_injected_failure_fails_the_job_and_a_retry_resumes(slurm: SlurmHook, payload_python: Path, digits_dir: Path):
    hparams = {"data_dir": str(digits_dir), "epochs": 2, "fail_at_epoch": 1}
    context = make_context("simclr-flaky")
    op = simclr_op("simclr-flaky", payload_python, hparams)
    trigger = defer(op, context)
    with pytest.raises(AirflowException, match=r"(?s)failed.*fail_at_epoch=1: failing on purpose"):
        op.execute_complete(context, first_event(trigger))
    # Every rank fails; srun's status is 1, or 143 when it stopped a rank that had not exited yet.
    assert exit_marker(slurm, trigger.run_dir)["exit_code"] in {1, 143}

    retry = simclr_op("simclr-flaky", payload_python, hparams)  # what Airflow's retry does: a new job
    result = retry.execute_complete(context, first_event(defer(retry, context)))
    metrics = assert_trained(slurm, result, epochs=2)
    assert values(metrics, "resumed_from_epoch") == [1.0]


def test_bad_hyperparameters_fail_fast_with_the_reason(slurm: SlurmHook, payload_python: Path, digits_dir: Path):
    op = simclr_op("simclr-bad", payload_python, {"data_dir": str(digits_dir), "epochs": 0, "lrr": 1}, tasks=1)
    context = make_context("simclr-bad")
    trigger = defer(op, context)
    with pytest.raises(AirflowException, match=r"(?s)failed.*unknown hyperparameter\(s\): lrr"):
        op.execute_complete(context, first_event(trigger))
    assert exit_marker(slurm, trigger.run_dir)["exit_code"] == 2  # the payload's "bad input" status


def test_torchrun_launcher_runs_the_same_payload(slurm: SlurmHook, payload_python: Path, digits_dir: Path):
    """torchrun starts the workers (one agent per node); the payload reads torchrun's environment."""
    op = SlurmJobOperator(
        task_id="simclr-torchrun",
        launcher="torchrun",
        program=[str(payload_python), str(TRAIN)],  # as with every launcher
        python=str(payload_python),
        allocation={"tasks_per_node": 2, "time_limit": "10"},
        hyperparameters={"data_dir": str(digits_dir), "epochs": 1},
        **FAST,
    )
    context = make_context("simclr-torchrun")
    result = op.execute_complete(context, first_event(defer(op, context)))
    assert_trained(slurm, result, epochs=1)
    log = slurm.read_file(result["log"]).decode()
    assert log.count("joining gloo process group at env:// (torchrun)") == 2
