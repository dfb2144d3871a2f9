"""Metrics a job wrote as JSON lines: pcflow's one-metric-per-line format, and VISSL's metrics.json.

pcflow (the payload's `$PCFLOW_METRICS_FILE`):
    {"time": 1767000000.1, "epoch": 3, "step": 120, "name": "loss", "value": 0.93, "split": "train"}
VISSL (`<checkpoint dir>/metrics.json`, and `stdout.json` alike): many metrics per line, nested meters:
    {"iteration": 500, "phase_idx": 1, "train_phase_idx": 0,
     "test_accuracy_list_meter": {"top_1": {"res5": 41.2}, "top_5": {"res5": 70.3}}}
which becomes `test_accuracy_list_meter/top_1/res5` = 41.2 at step 500, split eval.

Reading never fails: a line that is not JSON (a job killed mid-write leaves half a line), lacks a
value or has the wrong types is counted and skipped. NaN and inf are kept: they are news (divergence).
The job writes these files, so what they may cost is bounded: callers read at most a tail of them,
a name is at most MAX_NAME_CHARS long, and at most MAX_METRIC_NAMES distinct names are kept (points
of further names are counted, not kept).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from pcflow.readings.series import Point

MAX_NAME_CHARS = 128
MAX_METRIC_NAMES = 256
_INDEX_KEYS = {"iteration", "phase_idx", "train_phase_idx", "epoch", "step", "time", "timestamp", "eta", "split"}


@dataclass
class ReadResult:
    """What reading a metrics file gave: the points, and how many lines were bad or cut, with the first reason,
    so the harvest can report a file it only half understood instead of failing on it."""

    points: list[Point] = field(default_factory=list)
    lines: int = 0
    bad_lines: int = 0
    truncated_tail: bool = False
    first_error: str = ""
    names: set[str] = field(default_factory=set)
    dropped_points: int = 0

    def reject(self, number: int, why: str) -> None:
        """Count a bad line, keeping the first reason (one is enough to tell what the job writes wrong)."""
        self.bad_lines += 1
        if not self.first_error:
            self.first_error = f"line {number}: {why}"

    def as_dict(self) -> dict[str, Any]:
        """The counts for the harvest document (the points themselves go into series)."""
        return {
            "lines": self.lines,
            "points": len(self.points),
            "bad_lines": self.bad_lines,
            "truncated_tail": self.truncated_tail,
            **({"first_error": self.first_error} if self.first_error else {}),
            **(
                {"dropped_points": self.dropped_points, "why_dropped": f"more than {MAX_METRIC_NAMES} metric names"}
                if self.dropped_points
                else {}
            ),
        }

    def keep(self, points: list[Point]) -> None:
        """Points of the first MAX_METRIC_NAMES names; others are counted."""
        for point in points:
            if point.name not in self.names and len(self.names) >= MAX_METRIC_NAMES:
                self.dropped_points += 1
                continue
            self.names.add(point.name)
            self.points.append(point)


def _number(value: Any) -> float | None:
    """A JSON number (or NaN/inf, as Python's json and 'NaN' strings spell them); not a bool."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return float(value.strip().lower().replace("infinity", "inf"))
    return None


def _int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and math.isfinite(number) else None


def _split(name: str) -> str | None:
    lowered = name.lower()
    if lowered.startswith(("test", "val", "eval")):
        return "eval"
    if lowered.startswith("train"):
        return "train"
    return None


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if len(prefix) > MAX_NAME_CHARS:
        return
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}/{key}" if prefix else str(key), inner, out)
        return
    number = _number(value)
    if number is not None:
        out[prefix] = number


def record_points(record: dict[str, Any]) -> list[Point] | str:
    """The points of one decoded line, or why there are none."""
    time = _number(record.get("time", record.get("timestamp")))
    step = _int(record.get("step", record.get("iteration")))
    epoch = _int(record.get("epoch", record.get("train_phase_idx", record.get("phase_idx"))))
    if "name" in record and "value" in record:  # pcflow: one metric per line
        name, value = record["name"], _number(record["value"])
        if not isinstance(name, str) or not name:
            return "name is not a non-empty string"
        if len(name) > MAX_NAME_CHARS:
            return f"name is longer than {MAX_NAME_CHARS} characters"
        if value is None:
            return f"value of {name!r} is not a number"
        split = record.get("split") if isinstance(record.get("split"), str) else None
        return [Point(name, value, step, epoch, time, split)]
    flat: dict[str, float] = {}
    for key, value in record.items():
        if key not in _INDEX_KEYS:
            _flatten(str(key), value, flat)
    if not flat:
        return "no numeric metric in the line"
    return [Point(name, value, step, epoch, time, _split(name)) for name, value in flat.items()]


def read_metric_lines(data: bytes | str) -> ReadResult:
    """Every point of a JSON-lines file, in file order; bad lines counted, never raised."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    result = ReadResult()
    lines = text.split("\n")
    # The last line has no newline yet when the writer was killed (or is still writing).
    result.truncated_tail = bool(lines and lines[-1].strip())
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        result.lines += 1
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            result.reject(number, f"not JSON ({exc.msg})")
            continue
        except RecursionError:
            result.reject(number, "nested too deeply")
            continue
        if not isinstance(record, dict):
            result.reject(number, "not a JSON object")
            continue
        points = record_points(record)
        if isinstance(points, str):
            result.reject(number, points)
        else:
            result.keep(points)
    if result.truncated_tail and not result.bad_lines:
        result.truncated_tail = False  # complete JSON without its newline yet: it parsed, nothing lost
    return result


def from_line_start(data: bytes, offset: int) -> bytes:
    """A file's tail read from `offset`, less the partial line it starts with (none when offset is 0)."""
    if offset == 0:
        return data
    newline = data.find(b"\n")
    return data[newline + 1 :] if newline >= 0 else b""
