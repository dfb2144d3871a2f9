"""Teardown as a convergence loop: list by tag, delete in order, list again until nothing is left.

- `engine`: the loop (`converge`) and `teardown`, which builds the handlers and raises when something
  is left;
- `handlers`: one handler per kind of resource, by service, on one list-by-tag base;
- `registry`: handler sets by name (`ec2`, `fsx`, `images`; the cluster stage registers `pcluster`);
- `model`, `report`, `errors`: the selected resources, what a teardown did, how an AWS error is read;
- `operators`: the one teardown operator, which the janitor and the network delete specialise.

Every name other modules imported from `pcflow.aws.teardown` when it was one module is exported here;
the handlers of each kind are in `pcflow.aws.teardown.handlers`.
"""

from pcflow.aws.teardown.engine import converge, teardown
from pcflow.aws.teardown.errors import RETRYABLE_CODES, is_gone, is_retryable
from pcflow.aws.teardown.handlers import Handler, ListByTagHandler, ResourceHandler
from pcflow.aws.teardown.model import Resource, Selector
from pcflow.aws.teardown.operators import TeardownOperator
from pcflow.aws.teardown.registry import (
    DEFAULT_HANDLER_SETS,
    ClientSource,
    HandlerFactory,
    build_handlers,
    register_handlers,
    registered_handler_sets,
)
from pcflow.aws.teardown.report import TeardownIncomplete, TeardownReport

__all__ = [
    "DEFAULT_HANDLER_SETS",
    "RETRYABLE_CODES",
    "ClientSource",
    "Handler",
    "HandlerFactory",
    "ListByTagHandler",
    "Resource",
    "ResourceHandler",
    "Selector",
    "TeardownIncomplete",
    "TeardownOperator",
    "TeardownReport",
    "build_handlers",
    "converge",
    "is_gone",
    "is_retryable",
    "register_handlers",
    "registered_handler_sets",
    "teardown",
]
