"""Which AWS error codes mean "already gone" and which mean "try again next pass".

The loop and the handlers that delete more than one thing (an image and its snapshots) read an error
the same way, so the rule lives here once."""

from __future__ import annotations

#: Errors meaning "try again after something else is gone".
RETRYABLE_CODES = frozenset(
    {
        "DependencyViolation",
        "InvalidParameterValue",
        "ResourceInUse",
        "InvalidIPAddress.InUse",
        "InvalidNetworkInterface.InUse",
        "BadRequest",
        "IncorrectState",
        "InvalidState",
    }
)


def is_gone(code: str, message: str = "", resource_id: str | None = None) -> bool:
    """An error saying the resource itself does not exist: its deletion already happened.

    A NotFound about *another* id (e.g. a route table an endpoint still references) is not "gone";
    misjudging is harmless anyway, because every deletion is confirmed by listing again."""
    if code in {"NoSuchBucket", "InvalidAMIID.Unavailable"}:
        return True
    if not code.endswith("NotFound"):
        return False
    return resource_id is None or not message or resource_id in message


def is_retryable(code: str) -> bool:
    """Whether a failed deletion is "not yet" (a dependency still in use, throttling): the next pass tries again."""
    return code in RETRYABLE_CODES or code.endswith("InUse") or code.endswith(".InUse")
