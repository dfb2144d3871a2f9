"""What a deferred task gets back from its trigger, checked before it is read.

Every `execute_complete` (and other resume method) of pcflow starts with `validate_event`: a resume
without an event, or with one that is not a mapping, has no status pcflow's triggers send, or lacks a
key the task reads, fails the task with a message naming what was wrong, instead of being taken for
success. `require_success` adds the common case: any status but `success` fails with the trigger's
message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pcflow.errors import TriggerEventError, WaitFailed

SUCCESS = "success"
#: What pcflow's triggers (and the Amazon provider's waiter triggers) put in `status`.
STATUSES = frozenset({SUCCESS, "error", "failed"})


def validate_event(event: Any, *, task: str, required: Sequence[str] = ()) -> dict[str, Any]:
    """The event as a dict, or TriggerEventError: missing, not a mapping, no known status, or without
    one of the `required` keys."""
    if event is None:
        raise TriggerEventError(f"{task} resumed without an event from its trigger: the wait's outcome is unknown")
    if not isinstance(event, Mapping):
        raise TriggerEventError(f"{task} resumed with a {type(event).__name__} instead of a trigger event: {event!r}")
    status = event.get("status")
    if status not in STATUSES:
        raise TriggerEventError(
            f"{task} resumed with an event of status {status!r} (expected one of {', '.join(sorted(STATUSES))}): "
            f"{dict(event)!r}"
        )
    missing = [key for key in required if key not in event]
    if missing:
        raise TriggerEventError(f"{task} resumed with an event without {', '.join(missing)}: {dict(event)!r}")
    return dict(event)


def require_success(event: Any, *, task: str, what: str, required: Sequence[str] = ()) -> dict[str, Any]:
    """`validate_event`, then WaitFailed unless the status is `success` (`what`: the wait, for the message)."""
    checked = validate_event(event, task=task, required=required)
    if checked["status"] != SUCCESS:
        raise WaitFailed(f"{what} failed: {checked.get('message') or checked['status']}")
    return checked
