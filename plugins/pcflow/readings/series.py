"""Metric points, grouped into series, and what a person asks of a series: its final and best value.

A point comes from the job's JSON lines, VISSL's metrics.json or a regex over the log. A requeued
attempt may repeat a step: the later point is the one that counted, so a series keeps one point per
(epoch, step) — the last one read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Mode = Literal["max", "min"]
MODES = ("max", "min")

# Names whose better direction is obvious; anything else has no "best", only a final value.
_LOWER_IS_BETTER = ("loss", "error", "perplexity", "err", "wer", "cer", "mse", "mae", "rmse")
_HIGHER_IS_BETTER = ("acc", "accuracy", "top_1", "top_5", "top1", "top5", "precision", "recall", "f1", "auc", "map")


@dataclass(frozen=True)
class Point:
    """One metric value as the job reported it, with whatever position it gave (step, epoch, time) and its split."""

    name: str
    value: float
    step: int | None = None
    epoch: int | None = None
    time: float | None = None
    split: str | None = None

    @property
    def finite(self) -> bool:
        return math.isfinite(self.value)


@dataclass(frozen=True)
class Objective:
    """The metric a run is judged by, and whether more or less is better."""

    name: str
    mode: Mode = "max"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an objective needs a metric name")
        if self.mode not in MODES:
            raise ValueError(f"objective mode must be 'max' or 'min', got {self.mode!r}")

    @classmethod
    def parse(cls, value: Objective | Mapping[str, Any] | str | None) -> Objective | None:
        """`{"name": "probe_accuracy", "mode": "max"}`, `"probe_accuracy:max"` or `"loss:min"`."""
        if value is None or isinstance(value, Objective):
            return value
        if isinstance(value, str):
            name, _, mode = value.partition(":")
            return cls(name.strip(), (mode.strip() or "max"))  # type: ignore[arg-type]
        return cls(str(value.get("name", "")), value.get("mode", "max"))

    def better(self, a: float, b: float) -> bool:
        """Is `a` better than `b`?"""
        return a > b if self.mode == "max" else a < b

    def as_dict(self) -> dict[str, str]:
        """JSON for XCom and trigger kwargs (`parse` reads it back)."""
        return {"name": self.name, "mode": self.mode}


def guess_mode(name: str) -> Mode | None:
    """`min` for a loss- or error-like name, `max` for an accuracy-like one, None when the name says neither:
    how a series' "best" is chosen without an objective."""
    words = name.lower().replace("/", "_").replace(".", "_").split("_")
    if any(w in _LOWER_IS_BETTER for w in words):
        return "min"
    if any(w in _HIGHER_IS_BETTER for w in words):
        return "max"
    return None


@dataclass
class Series:
    """One metric's points in order, one per (epoch, step): what the report plots and summarises."""

    name: str
    split: str | None = None
    points: list[Point] = field(default_factory=list)

    def finite_points(self) -> list[Point]:
        """The points with a finite value: NaN and inf are counted (divergence), never plotted or compared."""
        return [p for p in self.points if p.finite]

    @property
    def non_finite(self) -> int:
        return sum(not p.finite for p in self.points)

    def summary(self, mode: Mode | None = None) -> dict[str, Any]:
        """final/best/min/max over finite values; `diverged` when the last value read is NaN or inf."""
        mode = mode or guess_mode(self.name)
        finite = self.finite_points()
        out: dict[str, Any] = {"count": len(self.points), "split": self.split}
        if self.non_finite:
            out["non_finite"] = self.non_finite
        if self.points and not self.points[-1].finite:
            out["diverged"] = True
        if not finite:
            return out
        last = finite[-1]
        out.update(final=last.value, final_step=last.step, final_epoch=last.epoch)
        out.update(min=min(p.value for p in finite), max=max(p.value for p in finite))
        if mode:
            best = (max if mode == "max" else min)(finite, key=lambda p: p.value)
            out.update(best=best.value, best_step=best.step, best_epoch=best.epoch, mode=mode)
        return out


def group(points: Iterable[Point]) -> dict[str, Series]:
    """One series per metric name (`<split>:<name>` when a name appears under two splits), in order of
    first appearance; a repeated (epoch, step) keeps the later point, where the earlier one stood."""
    splits: dict[str, set[str | None]] = {}
    points = list(points)
    for p in points:
        splits.setdefault(p.name, set()).add(p.split)
    series: dict[str, Series] = {}
    index: dict[tuple[str, int | None, int | None], int] = {}
    for p in points:
        key = p.name if len(splits[p.name]) == 1 or p.split in (None, "train") else f"{p.split}:{p.name}"
        s = series.setdefault(key, Series(key, p.split))
        if p.step is None and p.epoch is None:
            s.points.append(p)
            continue
        slot = (key, p.epoch, p.step)
        if slot in index:
            s.points[index[slot]] = p
        else:
            index[slot] = len(s.points)
            s.points.append(p)
    return series
