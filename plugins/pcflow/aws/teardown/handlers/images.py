"""Baked AMIs and their snapshots: kept by a stage's teardown (reused by recipe hash), reaped by the
janitor once they expire, or deleted when a teardown policy names the `images` set."""

from __future__ import annotations

from typing import Any

from pcflow.aws.clients import error_code, error_message
from pcflow.aws.teardown.errors import is_gone
from pcflow.aws.teardown.handlers.base import ListByTagHandler
from pcflow.aws.teardown.model import Resource, Selector


class ImageHandler(ListByTagHandler):
    """Baked AMIs: deregistered, then their snapshots deleted (a deregistered AMI's snapshots still bill)."""

    kind, order = "image", 110
    operation, result_key, id_key = "describe_images", "Images", "ImageId"

    def arguments(self, selector: Selector) -> dict[str, Any]:
        return {"Owners": ["self"], "Filters": selector.ec2_filters()}

    def delete(self, resource: Resource) -> None:
        """Deregister the image, then delete its snapshots (they would bill on); a snapshot already gone is fine."""
        from botocore.exceptions import ClientError

        snapshots = [
            m["Ebs"]["SnapshotId"]
            for m in resource.detail.get("BlockDeviceMappings", [])
            if m.get("Ebs", {}).get("SnapshotId")
        ]
        self.client.deregister_image(ImageId=resource.id)
        for snapshot_id in snapshots:
            try:
                self.client.delete_snapshot(SnapshotId=snapshot_id)
            except ClientError as error:
                if not is_gone(error_code(error), error_message(error), snapshot_id):
                    raise


class SnapshotHandler(ListByTagHandler):
    """Tagged snapshots whose image is gone (an image's own snapshots go with it in `ImageHandler`)."""

    kind, order = "snapshot", 120
    operation, result_key, id_key = "describe_snapshots", "Snapshots", "SnapshotId"

    def arguments(self, selector: Selector) -> dict[str, Any]:
        return {"OwnerIds": ["self"], "Filters": selector.ec2_filters()}

    def delete(self, resource: Resource) -> None:
        """Delete the snapshot."""
        self.client.delete_snapshot(SnapshotId=resource.id)
