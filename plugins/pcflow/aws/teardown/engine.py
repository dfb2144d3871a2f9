"""The convergence loop (aws-nuke's engine, cloud-nuke's VPC order).

One pass: list every selected resource by tag, try to delete each in the best-known order, treat
dependency errors as "later", list again. Loop until nothing is left (success) or until passes stop
changing anything (then report what is left, with each resource's last error, and fail). A resource
already gone counts as deleted. Dry-run lists and reports without deleting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pcflow.aws.clients import AwsCallFailed, error_code, error_message
from pcflow.aws.teardown.errors import is_gone, is_retryable
from pcflow.aws.teardown.handlers import ResourceHandler
from pcflow.aws.teardown.model import Resource, Selector
from pcflow.aws.teardown.registry import DEFAULT_HANDLER_SETS, ClientSource, build_handlers
from pcflow.aws.teardown.report import TeardownIncomplete, TeardownReport
from pcflow.naming import TAG_RUN, TAG_STACK

log = logging.getLogger(__name__)


def _list_all(handlers: Sequence[ResourceHandler], selector: Selector) -> dict[tuple[str, str], Resource]:
    listed: dict[tuple[str, str], Resource] = {}
    for handler in handlers:
        for resource in handler.list(selector):
            listed[resource.key] = resource
    return listed


def _fingerprint(listed: Mapping[tuple[str, str], Resource]) -> frozenset[tuple[str, str, str]]:
    return frozenset((r.kind, r.id, r.state) for r in listed.values())


def converge(
    handlers: Iterable[ResourceHandler],
    selector: Selector,
    *,
    dry_run: bool = False,
    max_passes: int = 30,
    patience: int = 2,
    pass_delay: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    logger: logging.Logger | logging.LoggerAdapter = log,
) -> TeardownReport:
    """Delete everything `selector` picks until nothing is left or nothing changes; never raises for a
    resource that will not go (it is in the report's `remaining`), only for a failed listing.

    A resource a handler holds (an FSx file system whose export to S3 failed) keeps everything of its
    owner, the same stack and run, out of the loop: its cluster and network stay with it (`held`)."""
    ordered = sorted(handlers, key=lambda h: h.order)
    report = TeardownReport(dry_run=dry_run)
    listed = _list_all(ordered, selector)
    held_owners = _held_owners(ordered, listed, report)
    listed = _without_held(listed, held_owners, report)
    if dry_run:
        report.would_delete = sorted(listed.values(), key=lambda r: _order_of(ordered, r))
        logger.info("%s", report.summary())
        return report
    stale = 0
    while listed and report.passes < max_passes:
        report.passes += 1
        logger.info("teardown pass %s: %s resource(s) listed", report.passes, len(listed))
        _delete_all(ordered, listed, report, logger)
        relisted = _without_held(_list_all(ordered, selector), held_owners)
        gone = [r for key, r in listed.items() if key not in relisted]
        for resource in gone:
            report.errors.pop(resource.key, None)
            logger.info("confirmed deleted: %s", resource.describe())
        report.deleted.extend(gone)
        progress = _fingerprint(relisted) != _fingerprint(listed)
        listed = relisted
        if not listed:
            break
        stale = 0 if progress else stale + 1
        if stale > patience:
            break
        logger.info("teardown pass %s: %s left, waiting %ss", report.passes, len(listed), pass_delay)
        sleep(pass_delay)
    report.remaining = sorted(listed.values(), key=lambda r: _order_of(ordered, r))
    logger.info("%s", report.summary())
    return report


def _delete_all(
    ordered: Sequence[ResourceHandler],
    listed: Mapping[tuple[str, str], Resource],
    report: TeardownReport,
    logger: logging.Logger | logging.LoggerAdapter,
) -> None:
    """One pass's deletions, kind by kind in order; an error goes in the report, not up."""
    for handler in ordered:
        batch = [r for r in listed.values() if r.kind == handler.kind]
        if not batch:
            continue
        _attempt(lambda h=handler, b=batch: h.prepare(b), batch, report, logger)
        for resource in batch:
            _attempt(lambda h=handler, r=resource: h.delete(r), [resource], report, logger)


def _owner(resource: Resource) -> tuple[str | None, str | None]:
    return resource.tags.get(TAG_STACK), resource.tags.get(TAG_RUN)


def _held_owners(
    handlers: Sequence[ResourceHandler], listed: Mapping[tuple[str, str], Resource], report: TeardownReport
) -> set[tuple[str | None, str | None]]:
    """The (stack, run) owners of resources a handler holds; their reasons go in the report."""
    owners = set()
    for handler in handlers:
        batch = [r for r in listed.values() if r.kind == handler.kind]
        for key, reason in (handler.holds(batch) if batch else {}).items():
            owners.add(_owner(listed[key]))
            report.hold_reasons.append(reason)
    return owners


def _without_held(
    listed: dict[tuple[str, str], Resource],
    owners: set[tuple[str | None, str | None]],
    report: TeardownReport | None = None,
) -> dict[tuple[str, str], Resource]:
    """`listed` less everything of a held owner (recorded in `report.held` the first time)."""
    kept = {key: r for key, r in listed.items() if _owner(r) not in owners}
    if report is not None:
        report.held = [r for key, r in listed.items() if key not in kept]
    return kept


def _order_of(handlers: Sequence[ResourceHandler], resource: Resource) -> tuple[int, str]:
    for handler in handlers:
        if handler.kind == resource.kind:
            return (handler.order, resource.id)
    return (10**6, resource.id)


def _attempt(
    action: Callable[[], None],
    resources: Sequence[Resource],
    report: TeardownReport,
    logger: logging.Logger | logging.LoggerAdapter,
) -> None:
    from botocore.exceptions import ClientError

    try:
        action()
    except (ClientError, AwsCallFailed) as error:
        code = error_code(error)
        if len(resources) == 1 and is_gone(code, error_message(error), resources[0].id):
            return
        message = f"{code}: {error_message(error)}"
        for resource in resources:
            report.errors[resource.key] = message
        if is_retryable(code):
            logger.info("%s not deletable yet (%s); retrying next pass", resources[0].describe(), code)
        else:
            logger.warning("%s: %s", resources[0].describe(), message)


def teardown(
    clients: ClientSource,
    selector: Selector,
    *,
    handler_sets: Iterable[str] = DEFAULT_HANDLER_SETS,
    extra_handlers: Iterable[ResourceHandler] = (),
    dry_run: bool = False,
    raise_on_leftovers: bool = True,
    **loop_options: Any,
) -> TeardownReport:
    """List-delete-relist until converged; raises `TeardownIncomplete` when something is left."""
    handlers = [*build_handlers(clients, handler_sets), *extra_handlers]
    report = converge(handlers, selector, dry_run=dry_run, **loop_options)
    if raise_on_leftovers and not report.complete:
        raise TeardownIncomplete(report)
    return report
