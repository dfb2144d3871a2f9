"""What a multi-node GPU job's environment needs on a cluster whose compute nodes have EFA (issue 27.5).

ParallelCluster installs the EFA driver, libfabric and, in its AMIs, NCCL's aws-ofi-nccl plugin on nodes of a
compute resource with `Efa: {Enabled: true}` (pcflow renders it, and a placement group, where every instance type
of the queue has EFA: EC2 DescribeInstanceTypes `NetworkInfo.EfaSupported`). The job then selects the fabric with
the settings AWS documents for NCCL over EFA (EC2 user guide, "Get started with EFA and NCCL"; aws-ofi-nccl):

- `FI_PROVIDER=efa`: libfabric (and so aws-ofi-nccl) uses the EFA provider, never a TCP fallback;
- `FI_EFA_USE_DEVICE_RDMA=1`: on the types whose EFA does RDMA reads (p4d, p4de, p5, p5e, p5en, trn1, trn1n,
  trn2), GPU memory goes over the fabric directly;
- `FI_EFA_FORK_SAFE=1`: libfabric keeps registered memory safe across fork(), which PyTorch's DataLoader
  workers do.

The batch script sets each only where the run's own `training.env` does not (which therefore may change them).
A cluster without EFA (every static cluster, the local stack's) sets none: NCCL picks its sockets itself.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Families whose EFA supports RDMA (the EC2 user guide's list for FI_EFA_USE_DEVICE_RDMA).
RDMA_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en", "trn1", "trn1n", "trn2"})


def fabric_env(efa: bool, instance_types: Iterable[str]) -> dict[str, str]:
    """The job environment of a queue with EFA on (`efa`) whose nodes are of `instance_types`; {} without EFA.
    RDMA only when every type of the queue has it (a job may land on any of them)."""
    if not efa:
        return {}
    env = {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1"}
    types = list(instance_types)
    if types and all(kind.split(".", 1)[0] in RDMA_FAMILIES for kind in types):
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return env
