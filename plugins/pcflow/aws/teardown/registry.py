"""Handler sets by name: `ec2`, `fsx` and `images` here, others registered by the stage that owns the
kind (the cluster stage's `pcluster`), so a stage adds its kind to the same loop without touching it."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

from pcflow.aws.teardown.handlers import (
    NETWORK_HANDLERS,
    FsxFileSystemHandler,
    ImageHandler,
    ResourceHandler,
    SnapshotHandler,
)
from pcflow.errors import ConfigurationError

#: `service name -> boto3 client`; handler factories take one so they can reach any service.
ClientSource = Callable[[str], Any]
HandlerFactory = Callable[[ClientSource], Iterable[ResourceHandler]]

_REGISTRY: dict[str, HandlerFactory] = {}
#: Handler sets registered by another module, imported when first asked for: a worker parses only its
#: DAG's file, which need not import that module (the `janitor` DAG does not import the cluster stage).
_REGISTERED_BY = {"pcluster": "pcflow.cluster.teardown"}

#: What a stage's teardown deletes unless its policy says more: AMIs are kept (reused by recipe hash).
DEFAULT_HANDLER_SETS = ("ec2", "fsx")


def register_handlers(name: str, factory: HandlerFactory, *, replace: bool = False) -> None:
    """Make a handler set available to `teardown(... handler_sets=[name])` and to the operators."""
    if name in _REGISTRY and not replace:
        raise ValueError(f"teardown handler set {name!r} is already registered")
    _REGISTRY[name] = factory


def registered_handler_sets() -> list[str]:
    """The names of the handler sets registered so far (a lazily registered one appears once it is asked for)."""
    return sorted(_REGISTRY)


def build_handlers(clients: ClientSource, handler_sets: Iterable[str]) -> list[ResourceHandler]:
    """The handlers of the named sets, importing the module that registers a lazy one; an unknown name is
    refused with the known ones."""
    handlers: list[ResourceHandler] = []
    for name in handler_sets:
        if name not in _REGISTRY and name in _REGISTERED_BY:
            importlib.import_module(_REGISTERED_BY[name])
        if name not in _REGISTRY:
            known = sorted({*_REGISTRY, *_REGISTERED_BY})
            raise ConfigurationError(f"unknown teardown handler set {name!r}; choose from: {', '.join(known)}")
        handlers.extend(_REGISTRY[name](clients))
    return handlers


def _network_handlers(clients: ClientSource) -> list[ResourceHandler]:
    ec2 = clients("ec2")  # one client for the ten kinds: a client source may build a new one per call
    return [cls(ec2) for cls in NETWORK_HANDLERS]


register_handlers("ec2", _network_handlers)
register_handlers("fsx", lambda clients: [FsxFileSystemHandler(clients("fsx"))])
register_handlers("images", lambda clients: [ImageHandler(clients("ec2")), SnapshotHandler(clients("ec2"))])
