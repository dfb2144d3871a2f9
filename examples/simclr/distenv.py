"""Where this process sits in the job: rank, world size, rendezvous address; from torchrun or Slurm.

- torchrun (the `torchrun` launcher) sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
  MASTER_ADDR and MASTER_PORT: the process group is initialised from that environment.
- `srun` (one process per Slurm task) sets SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID: the
  rendezvous host is the allocation's first node (`scontrol show hostnames $SLURM_JOB_NODELIST`)
  and the port is derived from the job id, so two jobs sharing a node do not collide and a requeued
  job meets at the same place. MASTER_ADDR / MASTER_PORT, when set, win.
- `mpirun` (Open MPI, one rank per Slurm task) sets OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK and
  _LOCAL_SIZE: the rendezvous is the srun one, at the job's first node (where the hosts file puts
  rank 0). Checked before Slurm's variables, which a rank inherits from mpirun's or orted's step.
- Neither: one process, no process group.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

#: Rendezvous ports for Slurm jobs: RDZV_PORT_BASE + job id modulo RDZV_PORT_SPAN, below Linux's
#: ephemeral range (32768+), so an outgoing connection never holds the port a later job needs.
RDZV_PORT_BASE = 21000
RDZV_PORT_SPAN = 8000


@dataclass(frozen=True)
class DistEnv:
    launcher: str  #: "torchrun", "slurm" or "single"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    job_id: str = ""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def rendezvous_port(job_id: str | int) -> int:
    return RDZV_PORT_BASE + int(job_id) % RDZV_PORT_SPAN


def first_host(nodelist: str, expand: Callable[[str], list[str]] | None = None) -> str:
    """The first host of a Slurm node list (`node[1-3],gpu7`): through scontrol, which owns the syntax."""
    if re.fullmatch(r"[A-Za-z0-9_.\-]+", nodelist):
        return nodelist
    hosts = (expand or _scontrol_hostnames)(nodelist)
    if not hosts:
        raise RuntimeError(f"scontrol show hostnames {nodelist!r} returned no host")
    return hosts[0]


def _scontrol_hostnames(nodelist: str) -> list[str]:
    proc = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True, timeout=60
    )
    return proc.stdout.split()


def _tasks_on_first_node(value: str) -> int:
    """SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE look like `2`, `2(x3)` or `2(x2),1`."""
    match = re.match(r"\d+", value or "")
    return int(match.group()) if match else 1


def detect(env: Mapping[str, str] | None = None, expand: Callable[[str], list[str]] | None = None) -> DistEnv:
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(
            launcher="torchrun",
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 29500)),
            job_id=env.get("SLURM_JOB_ID", ""),
        )
    if "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        world = int(env["OMPI_COMM_WORLD_SIZE"])
        return DistEnv(
            launcher="mpirun",
            rank=int(env["OMPI_COMM_WORLD_RANK"]),
            world_size=world,
            local_rank=int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)),
            local_world_size=int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE", 1)),
            **_slurm_rendezvous(env, world, env.get("SLURM_JOB_NODELIST", ""), expand),
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world = int(env["SLURM_NTASKS"])
        return DistEnv(
            launcher="slurm",
            rank=int(env["SLURM_PROCID"]),
            world_size=world,
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            local_world_size=_tasks_on_first_node(
                env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1")
            ),
            **_slurm_rendezvous(env, world, env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"], expand),
        )
    return DistEnv(launcher="single")


def _slurm_rendezvous(
    env: Mapping[str, str], world: int, nodelist: str, expand: Callable[[str], list[str]] | None
) -> dict:
    """Where rank 0 listens: MASTER_ADDR/MASTER_PORT when set, else the first node and the job's port."""
    job_id = env.get("SLURM_JOB_ID", "0")
    if "MASTER_ADDR" in env:
        addr = env["MASTER_ADDR"]
    elif world > 1 and nodelist:
        addr = first_host(nodelist, expand)
    else:
        addr = "127.0.0.1"
    port = int(env["MASTER_PORT"]) if "MASTER_PORT" in env else rendezvous_port(job_id)
    return {"master_addr": addr, "master_port": port, "job_id": job_id}


def threads_per_task(
    requested: int, env: Mapping[str, str] | None = None, *, local_world_size: int = 1, per_node_agent: bool = False
) -> int:
    """Torch threads: the request, else the task's Slurm CPUs, else this machine's cores shared out.

    Under torchrun the Slurm task is the per-node agent: its CPUs are shared by its local workers.
    """
    env = os.environ if env is None else env
    if requested > 0:
        return requested
    if env.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return max(1, int(env["SLURM_CPUS_PER_TASK"]) // (max(1, local_world_size) if per_node_agent else 1))
    return max(1, (os.cpu_count() or 1) // max(1, local_world_size))
