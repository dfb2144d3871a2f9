"""What a ParallelCluster cluster bills for besides its compute nodes, as its settings say it: FSx for Lustre
(`FsxSpec`) and the head node's default type.

They sit in the settings layer, below the stages: the cluster's spec (`pcflow.cluster.spec.ClusterSpec`)
is built from them, and the cost estimate (`pcflow.pricing.cost.cluster_infrastructure`) reads them
without importing the cluster stage.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: The head node's instance type when the cluster's settings name none.
HEAD_NODE_INSTANCE_TYPE = "c5.xlarge"


class FsxSpec(BaseModel):
    """FSx for Lustre linked to the dataset's S3 prefix (SCRATCH_2: import/export paths; PERSISTENT_2: a DRA)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    deployment_type: Literal["SCRATCH_2", "PERSISTENT_2"] = "SCRATCH_2"
    storage_capacity_gib: int = Field(1200, ge=1200)
    per_unit_storage_throughput: Literal[125, 250, 500, 1000] = 125
    mount_dir: str = "/fsx"
    name: str = "fsx"
    association_name: str = "dataset"
    file_system_path: str = "/"
    export_prefix: str | None = None  # SCRATCH_2 ExportPath under the bucket; default: the import prefix
    deletion_policy: Literal["Delete", "Retain"] = "Delete"
    export_before_delete: bool = False

    @field_validator("mount_dir", "file_system_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or ".." in value.split("/") or not re.fullmatch(r"[\w/.-]+", value):
            raise ValueError(f"{value!r} must be an absolute path of letters, digits, '/', '.', '_', '-'")
        return value

    @model_validator(mode="after")
    def _capacity(self) -> FsxSpec:
        # FSx for Lustre: SCRATCH_2 and PERSISTENT_2 grow in steps of 2400 GiB after the first 1200.
        if self.storage_capacity_gib != 1200 and self.storage_capacity_gib % 2400:
            raise ValueError(
                f"storage_capacity_gib {self.storage_capacity_gib} is not a size FSx for Lustre offers: use 1200 "
                "or a multiple of 2400"
            )
        return self
