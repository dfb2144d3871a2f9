"""Handler sets by name: `ec2`, `fsx` and `images` here, others registered by the stage that owns the
kind (the cluster stage's `pcluster`), so a stage adds its kind to the same loop without touching it.

A stage's set is registered when its module is imported (`pcflow.cluster.teardown` registers `pcluster`),
and this module never imports a stage, by name or otherwise: whoever asks for a stage's set imports the
module that registers it (the pipeline, the `janitor` DAG, the UI, the alerts), so the layers contract sees
that import and a worker that parsed only its own DAG file still finds the set."""

from __future__ import annotations

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

#: What a stage's teardown deletes unless its policy says more: AMIs are kept (reused by recipe hash).
DEFAULT_HANDLER_SETS = ("ec2", "fsx")


def register_handlers(name: str, factory: HandlerFactory, *, replace: bool = False) -> None:
    """Make a handler set available to `teardown(... handler_sets=[name])` and to the operators."""
    if name in _REGISTRY and not replace:
        raise ValueError(f"teardown handler set {name!r} is already registered")
    _REGISTRY[name] = factory


def registered_handler_sets() -> list[str]:
    """The names of the handler sets registered so far: a stage's set appears once its module is imported."""
    return sorted(_REGISTRY)


def build_handlers(clients: ClientSource, handler_sets: Iterable[str]) -> list[ResourceHandler]:
    """The handlers of the named sets; an unknown name is refused with the known ones, and a reminder that a
    stage's set is known only once its module is imported (a teardown must not skip a kind silently)."""
    handlers: list[ResourceHandler] = []
    for name in handler_sets:
        if name not in _REGISTRY:
            raise ConfigurationError(
                f"unknown teardown handler set {name!r}; choose from: {', '.join(sorted(_REGISTRY))} "
                "(a stage's own set is registered when the module that defines it is imported)"
            )
        handlers.extend(_REGISTRY[name](clients))
    return handlers


def _network_handlers(clients: ClientSource) -> list[ResourceHandler]:
    ec2 = clients("ec2")  # one client for the ten kinds: a client source may build a new one per call
    return [cls(ec2) for cls in NETWORK_HANDLERS]


register_handlers("ec2", _network_handlers)
register_handlers("fsx", lambda clients: [FsxFileSystemHandler(clients("fsx"))])
register_handlers("images", lambda clients: [ImageHandler(clients("ec2")), SnapshotHandler(clients("ec2"))])
