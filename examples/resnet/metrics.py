"""pcflow's metrics lines, appended to $PCFLOW_METRICS_FILE by rank 0 and flushed one by one (pcflow
streams the file while the job runs):

    {"time": <unix s>, "epoch": int, "step": int, "name": str, "value": float, "split": "train"|"eval"}
"""

from __future__ import annotations

import json
import time
from pathlib import Path


class Metrics:
    """The metrics file, open for appending on rank 0 only (the other ranks write nothing)."""

    def __init__(self, path: str | None, enabled: bool):
        self._fh = None
        if enabled and path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(path, "a", encoding="utf-8")

    def write(self, name: str, value: float, *, epoch: int, step: int, split: str = "train") -> None:
        """One line, flushed at once: pcflow reads the file while the job runs."""
        if self._fh is not None:
            line = {"time": round(time.time(), 3), "epoch": epoch, "step": step, "name": name}
            self._fh.write(json.dumps({**line, "value": float(value), "split": split}) + "\n")
            self._fh.flush()

    def close(self) -> None:
        """Close the file (a later write is a no-op)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
