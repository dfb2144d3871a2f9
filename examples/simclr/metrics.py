"""JSON-lines metrics, one metric per line, appended (a requeued attempt adds to the same file):

    {"time": <unix seconds>, "epoch": int, "step": int, "name": str, "value": float, "split": "train"|"eval"}

Names: loss and lr (every logged step), epoch_loss, epoch_time and throughput (images per second,
all ranks) at the end of each epoch, resumed_from_epoch when an attempt resumes from a checkpoint,
resumed_from (value and step: the step resumed from) when an attempt resumes or follows a requeue,
warm_start_tensors (step 0) when the run starts from $PCFLOW_WARM_START's weights, probe_accuracy,
probe_train_accuracy, probe_loss and fewshot_accuracy at the end (split eval), with
probe_accuracy_untrained and fewshot_accuracy_untrained beside them (the untrained encoder).
A diverging loss is written (as NaN) before the payload fails.
A step of an epoch interrupted by a requeue appears twice: the later line is the one that counted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO

SPLITS = ("train", "eval")


def metric_line(name: str, value: float, *, epoch: int, step: int, split: str, now: float | None = None) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    value = float(value)  # NaN/inf are written as JSON's NaN/Infinity: a diverging run is news, not noise
    record = {
        "time": round(time.time() if now is None else now, 3),
        "epoch": int(epoch),
        "step": int(step),
        "name": name,
        "value": value,
        "split": split,
    }
    return json.dumps(record) + "\n"


class MetricsWriter:
    """Appends lines to the file and flushes each one (log streamers read it while training runs)."""

    def __init__(self, path: str | Path | None, enabled: bool = True) -> None:
        self._fh: IO[str] | None = None
        if enabled and path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(path, "a", encoding="utf-8")

    def write(self, name: str, value: float, *, epoch: int, step: int, split: str = "train") -> None:
        if self._fh is not None:
            self._fh.write(metric_line(name, value, epoch=epoch, step=step, split=split))
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
