"""FSx for Lustre file systems: deleted before the network (they put ENIs in its subnets), unless their
export to S3 before delete failed (then they hold the only copy of recent checkpoints)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pcflow.aws.teardown.handlers.base import ListByTagHandler
from pcflow.aws.teardown.model import Resource, Selector


class FsxFileSystemHandler(ListByTagHandler):
    """FSx file systems put ENIs in the subnet, so they go before subnets and security groups."""

    kind, order = "fsx-file-system", 20
    operation, result_key, id_key, state_key = "describe_file_systems", "FileSystems", "FileSystemId", "Lifecycle"

    def arguments(self, selector: Selector) -> dict[str, Any]:
        return {}  # FSx has no tag filter: the selector decides on each file system's tags

    def selects(self, selector: Selector, item: dict[str, Any], tags: dict[str, str]) -> bool:
        return selector.matches(tags) and item.get("Lifecycle") != "DELETED"

    def delete(self, resource: Resource) -> None:
        """Delete, unless already deleting (asynchronous: its ENIs leave the subnet when it is gone)."""
        if resource.state != "DELETING":
            self.client.delete_file_system(FileSystemId=resource.id)

    def holds(self, resources: Sequence[Resource]) -> dict[tuple[str, str], str]:
        """A file system whose last export before delete did not succeed holds data nowhere else (the
        checkpoints written since the last export): it stays, and so does what its cluster needs."""
        from pcflow.aws.storage import last_export_before_delete

        held = {}
        for resource in resources:
            if resource.state == "DELETING":
                continue
            task = last_export_before_delete(self.client, resource.id)
            if task is not None and task["Lifecycle"] != "SUCCEEDED":
                reason = (task.get("FailureDetails") or {}).get("Message") or "no details"
                held[resource.key] = (
                    f"FSx {resource.id}: its export to S3 before delete ({task['TaskId']}) is {task['Lifecycle']}: "
                    f"{reason}; the file system, its cluster and their network are kept until an export succeeds"
                )
        return held
