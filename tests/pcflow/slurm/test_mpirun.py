"""The `mpirun` launcher for real: a hosts file from the allocation, then Debian's Open MPI over two
compute nodes of the local stack, running a small C program compiled with mpicc on the head node."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from stacktools import LocalStack
from taskcontext import deferred_trigger, first_event, make_context

from pcflow.slurm.hook import SlurmHook
from pcflow.slurm.operators import SlurmJobOperator

pytestmark = pytest.mark.stack

SOURCE = Path(__file__).with_name("mpi_allreduce.c")
RANK_LINE = re.compile(r"^mpi rank (\d+) of (\d+) on (\S+): sum (\d+)$", re.MULTILINE)


def test_mpirun_runs_one_program_over_two_nodes(slurm: SlurmHook, local_stack: LocalStack):
    binary = local_stack.shared_root / "tests" / f"mpi-allreduce-{uuid.uuid4().hex[:8]}"
    slurm.run(["mkdir", "-p", str(binary.parent)])
    slurm.run(["mpicc", "-O2", "-o", str(binary), str(SOURCE)])
    op = SlurmJobOperator(
        task_id="mpi",
        launcher="mpirun",
        program=[str(binary)],
        allocation={"nodes": 2, "tasks_per_node": 2, "time_limit": "5"},
        poll_interval=0.2,
        confirm_interval=2.0,
    )
    context = make_context("mpi")
    result = op.execute_complete(context, first_event(deferred_trigger(op, context)))

    assert result["state"] == "COMPLETED" and result["exit_code"] == 0
    log = slurm.read_file(result["log"]).decode()
    ranks = RANK_LINE.findall(log)
    assert sorted(int(rank) for rank, *_ in ranks) == [0, 1, 2, 3], log
    assert {(size, total) for _, size, _, total in ranks} == {("4", "10")}  # 1+2+3+4, on every rank
    hosts = {host for _, _, host, _ in ranks}
    assert len(hosts) == 2 and hosts <= {"node1", "node2", "node3"}, hosts
    assert set(slurm.run(["scontrol", "show", "hostnames", result["nodes"]]).stdout.split()) == hosts
    # The hosts file the template wrote (the Caffe source's step before mpirun): two slots on each node.
    (hosts_file,) = Path(result["run_dir"]).glob("hosts.*")
    assert sorted(hosts_file.read_text().splitlines()) == sorted(f"{host} slots=2" for host in hosts)
