"""Compute nodes lost in the middle of training, at DAG level: `pretrain` trains with `torchrun` over two
nodes; after the first checkpoint one of them dies as a reclaimed spot instance does (everything on it
killed at once, then slurmctld told it is DOWN, as ParallelCluster's clustermgtd does). Slurm requeues
the job onto healthy nodes and the payload resumes from its last checkpoint; once the second attempt has
checkpointed too, a node of that attempt dies as well, and a newer checkpoint cut short (its sidecar
records the whole file's size and sha256, the bytes are half of it) is left beside the good one: the third
attempt resumes from the newest checkpoint that verifies, never the partial one. The run succeeds; its
report shows the three attempts and its summary the work lost (at most one checkpoint interval per requeue)
and the recovery time. The lost nodes come back (`stack.py up`), as ParallelCluster replaces instances."""

from __future__ import annotations

import datetime as dt
import hashlib
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

# Two node losses and resumes: ~7 min on a loaded machine, past the suite's 300 s default.
pytestmark = [pytest.mark.stack, pytest.mark.slow, pytest.mark.timeout(900)]
# Within what a trigger user may set (launcher, nodes, tasks_per_node) plus the epochs, pinned so that the
# node dies with epochs still to go whatever the profile's default becomes.
CONF = {"launcher": "torchrun", "nodes": 2, "tasks_per_node": 1, "hyperparameters": {"epochs": 3}}


def slurm(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=os.environ, timeout=60).stdout


class NodeLoss(threading.Thread):
    """Twice: waits for the running attempt's next checkpoint (its sidecar written: the checkpoint is whole),
    then loses that attempt's first node (its batch host and rendezvous host), then lifts Slurm's hold on the
    requeued job (BeginTime: about two minutes, while the killed attempt's credentials expire) as an
    administrator would. The first lost node comes back once the second attempt runs (two healthy nodes are
    left for the third); before the second release, a partial epoch-0003.pt is planted."""

    def __init__(self, run_dir: Path, job_name: str) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.job_name = run_dir, job_name
        self.victims: list[str] = []
        self.job_id: str | None = None
        self.error: str | None = None

    def run(self) -> None:
        try:
            for attempt, epoch in enumerate((1, 2)):
                self.lose_a_node(attempt, epoch)
                if epoch == 2:
                    plant_a_partial_checkpoint(self.run_dir / "checkpoints", done=2, partial=3)
                self.release_requeued_job(attempt + 1)
                if attempt == 0:
                    back = stack_cli("up")  # the replacement instance: the next loss leaves two healthy nodes
                    if back.returncode != 0:
                        raise RuntimeError(back.stdout + back.stderr)
        except Exception as exc:  # reported by the test, which asserts on it
            self.error = repr(exc)

    def lose_a_node(self, attempt: int, epoch: int, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        sidecar = self.run_dir / "checkpoints" / f"epoch-{epoch:04d}.pt.sha256.json"
        while not sidecar.is_file() or f"attempt {attempt} on" not in (self.run_dir / "job.log").read_text():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no checkpoint {sidecar} of attempt {attempt} after {timeout} s")
            time.sleep(0.1)
        self.job_id, nodes = slurm("squeue", "-h", "-n", self.job_name, "-o", "%i %N").split()
        self.victims.append(slurm("scontrol", "show", "hostnames", nodes).split()[0])
        lost = stack_cli("fail-node", self.victims[-1])
        if lost.returncode != 0:
            raise RuntimeError(lost.stdout + lost.stderr)

    def release_requeued_job(self, attempt: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and f"attempt {attempt} on" not in (self.run_dir / "job.log").read_text():
            subprocess.run(
                ["scontrol", "update", f"JobId={self.job_id}", "StartTime=now"],
                capture_output=True,
                env=os.environ,
                check=False,
            )
            time.sleep(1.0)


def plant_a_partial_checkpoint(checkpoints: Path, *, done: int, partial: int) -> None:
    """A newer checkpoint cut short: half the bytes of a whole one, its sidecar recording the whole file (as a
    copy or an FSx restore from S3 killed midway leaves it)."""
    whole = (checkpoints / f"epoch-{done:04d}.pt").read_bytes()
    name = f"epoch-{partial:04d}.pt"
    (checkpoints / name).write_bytes(whole[: len(whole) // 2])
    record = {"file": name, "size": len(whole), "sha256": hashlib.sha256(whole).hexdigest()}
    (checkpoints / f"{name}.sha256.json").write_text(json.dumps(record))


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


def test_lost_nodes_requeue_the_job_which_resumes_from_its_newest_verified_checkpoint(airflow, local_stack):
    when = dt.datetime.now(dt.UTC).replace(microsecond=0)
    key = run_key("pretrain", f"manual__{when.isoformat()}")
    run_dir = Path(RunDir.for_job(str(local_stack.shared_root), key, "train").root)
    loss = NodeLoss(run_dir, f"{key}.train")
    loss.start()
    try:
        result = run_dag("pretrain", CONF, logical_date=when, run_after=when)
        loss.join(timeout=60)
        assert loss.error is None and len(loss.victims) == 2, loss.error
        assert result.state == "success", result.task_states
        train = result.returned["train"]
        assert (train["state"], train["restarts"]) == ("COMPLETED", 2)

        # The log: each attempt on nodes without the node lost before it; the partial checkpoint passed over.
        log = (run_dir / "job.log").read_text()
        attempts = attempts_in(log)
        assert [a for a, _ in attempts] == ["0", "1", "2"], attempts
        for (_, lost_on), (_, next_on), victim in zip(attempts[:-1], attempts[1:], loss.victims, strict=True):
            assert victim in hostnames(lost_on) and victim not in hostnames(next_on)
            assert len(hostnames(next_on)) == 2
        assert hostnames(train["nodes"]) == hostnames(attempts[-1][1])
        assert f"not resuming from {run_dir}/checkpoints/epoch-0003.pt: " in log, log[-3000:]
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
        resumed = [m for m in metrics if m["name"] == "resumed_from_epoch"]
        assert [m["value"] for m in resumed] == [1, 2]  # the third from epoch 2, not the partial epoch 3
        for epoch in (1, 2):
            assert f"resumed from {run_dir}/checkpoints/epoch-{epoch:04d}.pt" in log
        after = metrics[metrics.index(resumed[-1]) :]
        assert min(m["epoch"] for m in after if m["name"] == "loss") == 2  # no epoch twice

        # The run summary says what each requeue cost: the steps the lost attempt reached past the checkpoint
        # resumed from (at most one checkpoint interval: an epoch), summed, and the recovery time.
        marks = [i for i, m in enumerate(metrics) if m["name"] == "resumed_from"]
        assert [(metrics[i]["step"], metrics[i]["epoch"]) for i in marks] == [(m["step"], m["value"]) for m in resumed]
        steps_per_epoch = resumed[0]["step"] // resumed[0]["value"]
        spans = zip([0, *marks[:-1]], marks, strict=True)  # each lost attempt's lines
        reached = [max(m["step"] for m in metrics[a:b] if m["split"] == "train") for a, b in spans]
        lost = [r - metrics[i]["step"] for r, i in zip(reached, marks, strict=True)]
        assert all(0 <= n <= steps_per_epoch for n in lost), (lost, steps_per_epoch)
        resume = result.returned["metrics"]["resume"]
        assert isinstance(resume.pop("recovery_s"), float) and resume == {
            "restarts": 2,
            "resumed_from": {"step": resumed[-1]["step"], "epoch": 2},
            "reached_step": reached[-1],
            "steps_lost": sum(lost),
        }

        # The report shows every attempt: the two lost ones (NODE_FAIL) and the one that completed.
        report = report_attempts(result)
        assert [a["state"] for a in report] == ["NODE_FAIL", "NODE_FAIL", "COMPLETED"], report
        for row, victim in zip(report[:2], loss.victims, strict=True):
            assert victim in hostnames(row["node_list"]), report
        assert tagged_resources("pcflow:run", result.run_key) == []
    finally:
        loss.join(timeout=300)
        back = stack_cli("up")  # the lost nodes return (replacement instances, on ParallelCluster)
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
