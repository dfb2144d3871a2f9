"""A lock shared by the runs of a stack: one S3 object, written only if absent, so one holder wins.

Runs of a stack work from different workers (and the triggerer), with nothing in common but AWS: the lock
is an object in the stack's data bucket, created with S3's conditional write (`If-None-Match: *`), so of
two runs that try at once exactly one gets it. The object says who holds it (a run key) and since when.
Everything after that is conditional on the object's ETag as well, so that no two runs ever both believe
they hold it:

- a holder that finds its own lock (a retry of the same run, after its worker died) takes it over;
- a lock older than its stale age was left by a task that died holding it: anyone may break it;
- release deletes the object only if it is still this holder's (a lock broken and taken by another run
  meanwhile is refused: `LockNotHeld`).

A run that finds the lock held either waits here (`S3Lock.held`, in the worker) or defers until the object
is gone or changed hands (`S3Lock.released_trigger`, `pcflow.aws.waits.LockReleasedTrigger`), so a waiting
run holds no worker slot. Used for the stack's network (`pcflow.aws.network_users`) and for an image's bake
(`pcflow.aws.ami`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pcflow.aws.clients import error_code
from pcflow.errors import ResourceConflict

log = logging.getLogger(__name__)

MISSING = ("404", "NoSuchKey", "NotFound")
#: What S3 answers a conditional write or delete that lost (412; 409 when two conditional writes overlap).
LOST = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
#: At most this many bytes of a marker are read: a lock or reference is a few hundred.
MARKER_BYTES = 4096


class LockTimeout(ResourceConflict):
    """A lock stayed held by another run for longer than this task waits."""


class LockNotHeld(ResourceConflict):
    """A release by a run that does not hold the lock (any more): refused, the object is left alone."""


@dataclass(frozen=True)
class Marker:
    """A small JSON object pcflow keeps in S3 (a lock, a network reference): its content (`{}` when it is
    not a JSON object), when S3 wrote it, and its ETag (what a conditional write or delete names)."""

    content: dict[str, Any]
    written: dt.datetime
    etag: str


def read_marker(s3: Any, bucket: str, key: str) -> Marker | None:
    """One marker, at most MARKER_BYTES read; None when the object is gone. The one read every marker goes
    through."""
    from botocore.exceptions import ClientError

    try:
        got = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{MARKER_BYTES - 1}")
    except ClientError as error:
        if error_code(error) in MISSING:
            return None
        raise
    try:
        found = json.loads(got["Body"].read(MARKER_BYTES))
    except ValueError:
        found = None
    return Marker(found if isinstance(found, dict) else {}, got["LastModified"], got["ETag"])


@dataclass(frozen=True)
class Holding:
    """Who holds a lock (as its object says; None when unreadable), since when (S3's clock), and the
    object's ETag: a wait for its release watches that ETag."""

    holder: str | None
    since: dt.datetime
    etag: str

    def age(self) -> dt.timedelta:
        """How long it has been held, by S3's write time (not the holder's clock): compared to a stale age."""
        return dt.datetime.now(dt.UTC) - self.since


class S3Lock:
    """One lock object, `s3://bucket/key`, taken by `holder` (a run key), for `why` (said in the object and
    in the messages). A lock older than `stale_after` is broken: choose it above the longest time any holder
    keeps it (its task's execution timeout)."""

    def __init__(self, s3: Any, bucket: str, key: str, *, holder: str, why: str, stale_after: dt.timedelta):
        self.s3, self.bucket, self.key = s3, bucket, key
        self.holder, self.why, self.stale_after = holder, why, stale_after

    def __repr__(self) -> str:
        return f"S3Lock(s3://{self.bucket}/{self.key}, holder={self.holder!r})"

    def holding(self) -> Holding | None:
        """Who holds the lock now; None when it is free."""
        marker = read_marker(self.s3, self.bucket, self.key)
        if marker is None:
            return None
        return Holding(marker.content.get("holder"), marker.written, marker.etag)

    def try_acquire(self) -> Holding | None:
        """One try, without waiting: None when this holder now holds the lock, else who holds it. Takes over
        its own lock (a retry) and breaks a stale one, each only if the object is still the one it read."""
        for _ in range(5):  # each turn only when the object changed between two calls: bounded contention
            if self._write(IfNoneMatch="*"):
                return None
            found = self.holding()
            if found is None:
                continue  # released between the two calls: the next write may take it
            stale = found.age() > self.stale_after
            if found.holder != self.holder and not stale:
                return found
            log.warning("taking over %r (held by %s since %s%s)", self, found.holder, found.since, ", stale" * stale)
            if self._write(IfMatch=found.etag):
                return None
        return self.holding() or Holding(None, dt.datetime.now(dt.UTC), "")

    def _write(self, **condition: str) -> bool:
        """The lock object written under `condition`; False when the condition failed (someone else's)."""
        from botocore.exceptions import ClientError

        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        # The token makes each write a distinct object (its own ETag), also a retry's in the same second.
        token = uuid.uuid4().hex
        body = json.dumps({"holder": self.holder, "since": now, "why": self.why, "token": token}).encode()
        try:
            self.s3.put_object(Bucket=self.bucket, Key=self.key, Body=body, ContentType="application/json", **condition)
        except ClientError as error:
            if error_code(error) in LOST + MISSING:  # MISSING: an If-Match on an object deleted meanwhile
                return False
            raise
        return True

    def release(self) -> None:
        """Delete the lock, only if this holder holds it (the delete names the ETag it read, so a lock taken
        over in between is not deleted). Already gone: nothing to do. Held by another: LockNotHeld."""
        from botocore.exceptions import ClientError

        found = self.holding()
        if found is None:
            log.info("%r: already released", self)
            return
        if found.holder != self.holder:
            raise LockNotHeld(f"{self!r} is held by {found.holder} since {found.since}, not by {self.holder}: kept")
        try:
            self.s3.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=found.etag)
        except ClientError as error:
            if error_code(error) in MISSING:
                return
            if error_code(error) in LOST:
                raise LockNotHeld(f"{self!r} was taken over while {self.holder} released it: kept") from error
            raise

    @contextmanager
    def held(
        self,
        *,
        timeout: float,
        delay: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
        error: type[LockTimeout] = LockTimeout,
    ) -> Iterator[None]:
        """Hold the lock while the body runs, waiting in this process up to `timeout` seconds for it (then
        `error`, a LockTimeout that names what the lock is for)."""
        waited = 0.0
        while (found := self.try_acquire()) is not None:
            if waited >= timeout:
                raise error(
                    f"{self.why}: the lock s3://{self.bucket}/{self.key} is still held by {found.holder} after "
                    f"{waited:.0f} s (since {found.since}); if that run is not doing this any more, delete the "
                    "object and retry"
                )
            log.info("%r is held by %s since %s; waiting", self, found.holder, found.since)
            sleep(delay)
            waited += delay
        with self.releasing():
            yield

    @contextmanager
    def releasing(self) -> Iterator[None]:
        """Release the lock (taken with `try_acquire`) when the body ends, however it ends."""
        try:
            yield
        finally:
            self.release()

    def released_trigger(self, found: Holding, *, waiter_delay: int, **connection: Any) -> Any:
        """The trigger an operator defers on while `found` holds the lock: it fires once the object is gone
        or is no longer the one seen (released, taken over, broken), and the operator tries again."""
        from pcflow.aws import waits

        return waits.LockReleasedTrigger(
            bucket=self.bucket,
            key=self.key,
            etag=found.etag,
            holder=found.holder or "",
            waiter_delay=waiter_delay,
            **connection,
        )
