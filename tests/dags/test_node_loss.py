"""A compute node lost in the middle of training, at DAG level: `pretrain` trains with `torchrun` over two
nodes; after the first checkpoint one of them dies as a reclaimed spot instance does (everything on it
killed at once, then slurmctld told it is DOWN, as ParallelCluster's clustermgtd does). Slurm requeues
the job onto healthy nodes, the payload resumes from its last checkpoint, the run succeeds, its report shows
both attempts and its summary the work lost (steps reached minus the step resumed from). The lost node
comes back afterwards (`stack.py up`)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import boto3
import pytest
from dagrun import remove_stack, run_dag, tagged_resources
from stacktools import stack_cli, stack_status

from pcflow.naming import run_key
from pcflow.slurm.spec import RunDir

pytestmark = [pytest.mark.stack, pytest.mark.slow]
# Within what a trigger user may set (launcher, nodes, tasks_per_node) plus the epochs, pinned so that the
# node dies with epochs still to go whatever the profile's default becomes.
CONF = {"launcher": "torchrun", "nodes": 2, "tasks_per_node": 1, "hyperparameters": {"epochs": 3}}


def slurm(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=os.environ, timeout=60).stdout


class NodeLoss(threading.Thread):
    """Waits for the job's first checkpoint, then loses the job's first node (its batch host and
    rendezvous host), then lifts Slurm's hold on the requeued job (BeginTime: about two minutes, while
    the killed attempt's credentials expire) as an administrator would."""

    def __init__(self, run_dir: Path, job_name: str) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.job_name = run_dir, job_name
        self.victim: str | None = None
        self.job_id: str | None = None
        self.error: str | None = None

    def run(self) -> None:
        try:
            self.lose_a_node()
            self.release_requeued_job()
        except Exception as exc:  # reported by the test, which asserts on it
            self.error = repr(exc)

    def lose_a_node(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not (self.run_dir / "checkpoints" / "epoch-0001.pt").is_file():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no first checkpoint in {self.run_dir} after {timeout} s")
            time.sleep(0.1)
        self.job_id, nodes = slurm("squeue", "-h", "-n", self.job_name, "-o", "%i %N").split()
        self.victim = slurm("scontrol", "show", "hostnames", nodes).split()[0]
        lost = stack_cli("fail-node", self.victim)
        if lost.returncode != 0:
            raise RuntimeError(lost.stdout + lost.stderr)

    def release_requeued_job(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and "attempt 1 on" not in (self.run_dir / "job.log").read_text():
            subprocess.run(
                ["scontrol", "update", f"JobId={self.job_id}", "StartTime=now"],
                capture_output=True,
                env=os.environ,
                check=False,
            )
            time.sleep(1.0)


def attempts_in(log: str) -> list[tuple[str, str]]:
    """(attempt, node list) of each `pcflow: job N attempt A on NODES` line the batch wrapper wrote."""
    found = []
    for line in log.splitlines():
        words = line.split()
        if line.startswith("pcflow: job ") and words[3:4] == ["attempt"] and words[5:6] == ["on"]:
            found.append((words[4], words[6]))
    return found


def hostnames(node_list: str) -> set[str]:
    return set(slurm("scontrol", "show", "hostnames", node_list).split())


def test_a_lost_node_requeues_the_job_which_resumes_from_its_checkpoint(airflow, local_stack):
    when = dt.datetime.now(dt.UTC).replace(microsecond=0)
    key = run_key("pretrain", f"manual__{when.isoformat()}")
    run_dir = Path(RunDir.for_job(str(local_stack.shared_root), key, "train").root)
    loss = NodeLoss(run_dir, f"{key}.train")
    loss.start()
    try:
        result = run_dag("pretrain", CONF, logical_date=when, run_after=when)
        loss.join(timeout=60)
        assert loss.error is None and loss.victim, loss.error
        assert result.state == "success", result.task_states
        train = result.returned["train"]
        assert (train["state"], train["restarts"]) == ("COMPLETED", 1)

        # The log: attempt 0 on the lost node, attempt 1 on two others, resumed from a checkpoint.
        log = (run_dir / "job.log").read_text()
        (first, first_nodes), (second, second_nodes) = attempts_in(log)
        assert (first, second) == ("0", "1")
        assert loss.victim in hostnames(first_nodes) and loss.victim not in hostnames(second_nodes)
        assert len(hostnames(second_nodes)) == 2 and hostnames(train["nodes"]) == hostnames(second_nodes)
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
        (resumed,) = [m for m in metrics if m["name"] == "resumed_from_epoch"]
        assert 1 <= resumed["value"] < 3 and resumed["step"] > 0  # from a checkpoint, not from scratch
        assert f"resumed from {run_dir}/checkpoints/epoch-{int(resumed['value']):04d}.pt" in log
        after = metrics[metrics.index(resumed) :]
        assert min(m["epoch"] for m in after if m["name"] == "loss") == resumed["value"]  # no epoch twice

        # The run summary says what the requeue cost: the step the lost attempt reached (its last metrics line
        # before the resumed attempt's `resumed_from`), the step and epoch resumed from, and the difference.
        (resumed_from,) = [m for m in metrics if m["name"] == "resumed_from"]
        assert (resumed_from["step"], resumed_from["epoch"]) == (resumed["step"], resumed["value"])
        before = metrics[: metrics.index(resumed_from)]
        reached = max(m["step"] for m in before if m["split"] == "train")
        assert reached >= resumed["step"]
        assert result.returned["metrics"]["resume"] == {
            "restarts": 1,
            "resumed_from": {"step": resumed["step"], "epoch": resumed["value"]},
            "reached_step": reached,
            "steps_lost": reached - resumed["step"],
        }

        # The report shows both attempts: the lost one (NODE_FAIL) and the one that completed.
        attempts = report_attempts(result)
        assert [a["state"] for a in attempts] == ["NODE_FAIL", "COMPLETED"], attempts
        assert loss.victim in hostnames(attempts[0]["node_list"]), attempts
        assert loss.victim not in hostnames(attempts[1]["node_list"]), attempts
        assert tagged_resources("pcflow:run", result.run_key) == []
    finally:
        loss.join(timeout=150)
        back = stack_cli("up")  # the lost node returns (a replacement instance, on ParallelCluster)
        assert back.returncode == 0, back.stdout + back.stderr
        nodes = [s["node"] for s in stack_status().values() if "node" in s]
        assert {n["state"] for n in nodes} == {"idle"}, nodes
        assert remove_stack("local") == []  # what the run keeps on purpose (image, data bucket)


def report_attempts(result) -> list[dict]:
    """The report's attempts table, read from the report.html the metrics stage wrote to S3."""
    bucket, key = result.returned["metrics"]["report"].removeprefix("s3://").split("/", 1)
    html = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    table = html[html.index('id="attempts-table"') : html.index("</table>", html.index('id="attempts-table"'))]
    rows = re.findall(r"<tr><td>(\d+)</td><td>([^<]*)</td><td>([^<]*)</td>", table)
    return [{"attempt": int(n), "node_list": nodes, "state": state} for n, nodes, state in rows]
