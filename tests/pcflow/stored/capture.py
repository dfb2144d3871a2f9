"""Write tests/pcflow/stored/<version>.json: pcflow's triggers as this release stores them in Airflow's
metadata database (class path, and the kwargs column as Airflow's Trigger model writes it, decrypted),
one of each kind, with the arguments its operators pass. Run once per release, then keep the file:
tests/pcflow/test_compat.py rebuilds every stored trigger of every release with the code of today.

    .venv/bin/python tests/pcflow/stored/capture.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "plugins"))

HEAD = {  # the head node as a created cluster's train task passes it
    "ssh_conn_id": "pcluster_default",
    "remote_host": "10.0.1.23",
    "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ0iBZTeNh2FBcqJQ4KwYV7WQdkVbY1NVAqY7pm8A5dP",
    "slurm_bin": "/opt/slurm/bin",
}
AWS = {"aws_conn_id": "aws_default", "region_name": "us-east-1", "verify": None}


def budget() -> dict:
    """The train task's budget: the first task's cost section of the aws-gpu profile, and the run's start."""
    from pcflow.budget import plan_cost
    from pcflow.pipeline.settings import plan_run
    from pcflow.runspec import resolve_run_spec

    run = plan_run(resolve_run_spec("aws-gpu"), run_key="pretrain__capture", partition="default")
    return {**plan_cost(run).cost, "run_started": 1767225600.0}


def triggers() -> list:
    from pcflow.aws.clients import retry_botocore_config
    from pcflow.aws.waits import FsxDataRepositoryTaskTrigger, ImageAvailableTrigger
    from pcflow.cluster.triggers import ClusterStackTrigger
    from pcflow.metrics.early_stop import EarlyStoppingTrigger
    from pcflow.slurm.trigger import SlurmArrayTrigger, SlurmJobTrigger
    from pcflow.slurm.watch import WatchPolicy

    aws = {**AWS, "botocore_config": retry_botocore_config(None)}
    policy = dataclasses.asdict(WatchPolicy(poll_interval=5.0, pending_timeout=3600.0))
    rule = {"objective": {"name": "loss", "mode": "min"}, "patience": 3, "min_delta": 0.01}
    run_dir = "/fsx/pcflow/runs/pretrain-20261201T000000-1a2b3c/train"
    return [
        SlurmJobTrigger(
            **HEAD,
            job_id="4242",
            run_dir=run_dir,
            accounting=True,
            policy=policy,
            early_stopping=rule,
            budget=budget(),
            log_offset=1024,
        ),
        SlurmArrayTrigger(
            **HEAD,
            job_id="4243",
            run_dir=run_dir,
            accounting=False,
            policy=policy,
            size=4,
            min_success_ratio=0.5,
        ),
        EarlyStoppingTrigger(
            **HEAD,
            job_id="",
            run_dir=run_dir,
            policy={"poll_interval": 30.0},
            early_stopping=rule,
            element=2,
        ),
        ClusterStackTrigger(stack_name="pcflow-demo-train", waiter_name="stack_create_complete", **aws),
        FsxDataRepositoryTaskTrigger(task_id="task-0123456789abcdef0", waiter_delay=30, waiter_max_attempts=480, **aws),
        ImageAvailableTrigger(image_id="ami-0123456789abcdef0", waiter_delay=30, **aws),
    ]


def main() -> None:
    from airflow.models.crypto import get_fernet
    from airflow.models.trigger import Trigger

    from pcflow import __version__

    stored = []
    for trigger in triggers():
        classpath, kwargs = trigger.serialize()
        column = Trigger.encrypt_kwargs(kwargs)  # the kwargs column of Airflow's trigger table
        plain = column if column.startswith("{") else get_fernet().decrypt(column.encode()).decode()
        stored.append({"classpath": classpath, "kwargs": json.loads(plain)})  # kept decrypted: no key in git
    out = Path(__file__).with_name(f"{__version__}.json")
    out.write_text(json.dumps({"pcflow": __version__, "triggers": stored}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out.relative_to(REPO)}: {len(stored)} triggers")


if __name__ == "__main__":
    main()
