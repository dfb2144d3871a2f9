"""Progress lines at a steady cadence (files, bytes, rate, ETA), never one line per object.

A million-object load logging per object buries the task log; one line every `interval_s` says as much.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class Progress:
    """Counts a load's files and bytes from many upload threads and logs a line every `interval_s` (and one at
    the end): how a long load shows it is alive without a line per object."""

    def __init__(
        self,
        *,
        total_files: int,
        total_bytes: int,
        log: logging.Logger,
        label: str = "dataset",
        interval_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total_files, self.total_bytes = total_files, total_bytes
        self.files = self.bytes = self.uploaded = self.skipped = 0
        self.log, self.label, self.interval_s, self.clock = log, label, interval_s, clock
        self._lock = threading.Lock()
        self._start = self._last = clock()

    def advance(self, *, files: int = 1, nbytes: int = 0, uploaded: bool) -> None:
        """Count `files` more (uploaded, or skipped as unchanged); logs when a line is due. Safe from any thread."""
        with self._lock:
            self.files += files
            self.bytes += nbytes
            if uploaded:
                self.uploaded += files
            else:
                self.skipped += files
            now = self.clock()
            due = now - self._last >= self.interval_s
            if due:
                self._last = now
        if due:
            self.report()

    def report(self, final: bool = False) -> None:
        """Log one progress line now (`final`: the summary with the time taken instead of an ETA)."""
        elapsed = max(self.clock() - self._start, 1e-9)
        rate = self.bytes / elapsed
        remaining = max(self.total_bytes - self.bytes, 0)
        eta = remaining / rate if rate > 0 else float("inf")
        self.log.info(
            "%s %s: %d/%d files, %.1f/%.1f MiB (%d uploaded, %d unchanged), %.1f MiB/s, %.0f files/s, %s",
            self.label,
            "done" if final else "progress",
            self.files,
            self.total_files,
            self.bytes / 2**20,
            self.total_bytes / 2**20,
            self.uploaded,
            self.skipped,
            rate / 2**20,
            self.files / elapsed,
            f"took {elapsed:.1f} s" if final else f"ETA {eta:.0f} s",
        )
