"""Where this process sits in the job, from torchrun's or Slurm's environment, and the process group.

- torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
- `srun` (one process per Slurm task) sets SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID: rank 0 listens on
  the allocation's first node (`scontrol show hostnames`) at 21000 + job id % 8000, so two jobs sharing
  a node do not collide and a requeued job meets at the same place; MASTER_ADDR/MASTER_PORT win.
- Neither: one process, no process group.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Place:
    """This process's rank and world, on its node and in the job, and how the process group meets."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    init: str = ""  #: the process group's init_method ("" for one process)

    @property
    def main(self) -> bool:
        """Rank 0 writes metrics, checkpoints and the model; the others only train."""
        return self.rank == 0


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list (`node[1-3]`): through scontrol, which owns the syntax."""
    if re.fullmatch(r"[A-Za-z0-9_.\-]+", nodelist):
        return nodelist
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def detect(env=os.environ) -> Place:
    """Where this process sits: torchrun's variables, else Slurm's, else a single process."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return Place(
            int(env["RANK"]),
            int(env["WORLD_SIZE"]),
            int(env.get("LOCAL_RANK", 0)),
            int(env.get("LOCAL_WORLD_SIZE", 1)),
            "env://",
        )
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", 1)) > 1:
        host = env.get("MASTER_ADDR") or first_host(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])
        port = env.get("MASTER_PORT") or 21000 + int(env.get("SLURM_JOB_ID", 0)) % 8000
        per_node = re.match(r"\d+", env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1"))
        return Place(
            int(env["SLURM_PROCID"]),
            int(env["SLURM_NTASKS"]),
            int(env.get("SLURM_LOCALID", 0)),
            int(per_node.group()) if per_node else 1,
            f"tcp://{host}:{port}",
        )
    return Place()


def start(place: Place) -> torch.device:
    """This process's device (its GPU by local rank, else the CPU), in the job's process group."""
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{place.local_rank % torch.cuda.device_count()}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if place.world > 1:
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=place.init,
            rank=place.rank,
            world_size=place.world,
            timeout=datetime.timedelta(minutes=10),
        )
    return device


def threads(requested: int, place: Place) -> int:
    """Torch threads: the request, else the task's Slurm CPUs, else this machine's cores shared out."""
    if requested > 0:
        return requested
    cpus = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if cpus.isdigit() and place.init != "env://":
        return int(cpus)
    return max(1, (os.cpu_count() or 1) // max(1, place.local_world))


def all_sum(values: list[float], place: Place, device: torch.device) -> list[float]:
    """`values` summed over every process (as they are with one process)."""
    if place.world == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()
