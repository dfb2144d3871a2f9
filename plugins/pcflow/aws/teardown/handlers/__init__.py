"""One handler per kind of resource, by service; `base` holds the list-by-tag listing they share."""

from pcflow.aws.teardown.handlers.base import Handler, ListByTagHandler, ResourceHandler, paginate
from pcflow.aws.teardown.handlers.ec2 import (
    NETWORK_HANDLERS,
    ElasticIpHandler,
    InstanceHandler,
    InternetGatewayHandler,
    NatGatewayHandler,
    NetworkInterfaceHandler,
    RouteTableHandler,
    SecurityGroupHandler,
    SubnetHandler,
    VpcEndpointHandler,
    VpcHandler,
)
from pcflow.aws.teardown.handlers.fsx import FsxFileSystemHandler
from pcflow.aws.teardown.handlers.images import ImageHandler, SnapshotHandler

__all__ = [
    "NETWORK_HANDLERS",
    "ElasticIpHandler",
    "FsxFileSystemHandler",
    "Handler",
    "ImageHandler",
    "InstanceHandler",
    "InternetGatewayHandler",
    "ListByTagHandler",
    "NatGatewayHandler",
    "NetworkInterfaceHandler",
    "ResourceHandler",
    "RouteTableHandler",
    "SecurityGroupHandler",
    "SnapshotHandler",
    "SubnetHandler",
    "VpcEndpointHandler",
    "VpcHandler",
    "paginate",
]
