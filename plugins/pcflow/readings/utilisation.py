"""Utilisation samples the sampler (pcflow/readings/sampler.py) wrote during the job, summarised.

GPU use is reported as the seeds state it: the sum over all GPUs of the job, in percent of one GPU
(eight GPUs each 80% busy: 640% of 800%). CPU use is the node's, averaged over the job's nodes.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from statistics import fmean, median
from typing import Any

SAMPLER = "sampler.py"


@cache
def sampler_source() -> bytes:
    """The sampler script, as SlurmJobOperator uploads it beside the batch script."""
    return resources.files("pcflow.readings").joinpath(SAMPLER).read_bytes()


@dataclass
class Sample:
    """One line the sampler wrote: a node's CPU, memory and GPUs at one moment."""

    time: float
    host: str
    cpu_percent: float | None
    mem_used_mb: float | None
    mem_total_mb: float | None
    gpus: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Utilisation:
    """The job's samples from every node, and how many lines could not be read (counted, never fatal)."""

    samples: list[Sample] = field(default_factory=list)
    bad_lines: int = 0

    @property
    def hosts(self) -> list[str]:
        return sorted({s.host for s in self.samples})

    @property
    def gpu_count(self) -> int:
        """GPUs seen: the most any sample of a host reported, summed over hosts."""
        per_host: dict[str, int] = defaultdict(int)
        for s in self.samples:
            per_host[s.host] = max(per_host[s.host], len(s.gpus))
        return sum(per_host.values())

    def timeline(self) -> dict[str, list[tuple[float, float]]]:
        """Plot-ready series, seconds since the first sample: the job's total GPU use (% of one GPU),
        GPU memory used (% of the GPUs' total) and, per host, CPU use (%)."""
        if not self.samples:
            return {}
        start = min(s.time for s in self.samples)
        interval = self.interval()
        out: dict[str, list[tuple[float, float]]] = defaultdict(list)
        # Nodes sample on their own clocks: one bucket per sampling interval holds one sample of each.
        buckets: dict[int, dict[str, Sample]] = defaultdict(dict)
        for s in self.samples:
            if s.cpu_percent is not None:
                out[f"cpu % {s.host}"].append((s.time - start, s.cpu_percent))
            buckets[round((s.time - start) / interval)][s.host] = s
        if self.gpu_count:
            for slot in sorted(buckets):
                gpus = [g for s in buckets[slot].values() for g in s.gpus]
                if gpus:
                    at = round(slot * interval, 3)
                    out["gpu util % (sum)"].append((at, sum(g["util"] for g in gpus)))
                    total = sum(g["mem_total_mb"] for g in gpus)
                    if total:
                        out["gpu memory %"].append((at, 100 * sum(g["mem_used_mb"] for g in gpus) / total))
        return dict(out)

    def interval(self) -> float:
        """The sampling interval: the median gap between one host's consecutive samples (1 s if unknown)."""
        times: dict[str, list[float]] = defaultdict(list)
        for s in self.samples:
            times[s.host].append(s.time)
        gaps = [b - a for ts in times.values() for a, b in itertools.pairwise(sorted(ts)) if b > a]
        return median(gaps) if gaps else 1.0

    def per_gpu(self) -> list[dict[str, Any]]:
        """Each GPU's mean use and memory (% of its own), so one idle or saturated GPU stands out."""
        seen: dict[tuple[str, int], list[dict[str, float]]] = defaultdict(list)
        for s in self.samples:
            for g in s.gpus:
                seen[s.host, int(g["index"])].append(g)
        return [
            {
                "host": host,
                "index": index,
                "util_percent_mean": round(fmean(g["util"] for g in found), 1),
                "memory_percent_mean": round(fmean(100 * g["mem_used_mb"] / g["mem_total_mb"] for g in found), 1)
                if all(g["mem_total_mb"] for g in found)
                else None,
                "memory_used_mb_max": max(g["mem_used_mb"] for g in found),
            }
            for (host, index), found in sorted(seen.items())
        ]

    def summary(self) -> dict[str, Any]:
        """Means and peaks for the report and XCom (GPU use summed over the job's GPUs, in % of one), with its
        timeline for the charts."""
        if not self.samples:
            return {"samples": 0, "bad_lines": self.bad_lines}
        cpu = [s.cpu_percent for s in self.samples if s.cpu_percent is not None]
        mem = [s.mem_used_mb for s in self.samples if s.mem_used_mb is not None]
        out: dict[str, Any] = {
            "samples": len(self.samples),
            "bad_lines": self.bad_lines,
            "hosts": len(self.hosts),
            "window_s": round(max(s.time for s in self.samples) - min(s.time for s in self.samples), 1),
            "cpu_percent_mean": round(fmean(cpu), 1) if cpu else None,
            "mem_used_mb_max": max(mem) if mem else None,
            "gpus": self.gpu_count,
        }
        timeline = self.timeline()
        if self.gpu_count and timeline.get("gpu util % (sum)"):
            util = [v for _, v in timeline["gpu util % (sum)"]]
            mem_pct = [v for _, v in timeline.get("gpu memory %", [])]
            out.update(
                gpu_util_percent_mean=round(fmean(util), 1),
                gpu_util_percent_max=round(max(util), 1),
                gpu_util_capacity_percent=100 * self.gpu_count,
                gpu_util_percent_per_gpu_mean=round(fmean(util) / self.gpu_count, 1),
                gpu_memory_percent_mean=round(fmean(mem_pct), 1) if mem_pct else None,
                gpu_memory_percent_max=round(max(mem_pct), 1) if mem_pct else None,
                per_gpu=self.per_gpu(),
            )
        return out


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def read_samples(data: bytes | str) -> Utilisation:
    """Every readable sample; a torn or foreign line is counted, never raised."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    result = Utilisation()
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            sample = Sample(
                time=float(record["time"]),
                host=str(record.get("host", "?")),
                cpu_percent=_float(record.get("cpu_percent")),
                mem_used_mb=_float(record.get("mem_used_mb")),
                mem_total_mb=_float(record.get("mem_total_mb")),
                gpus=[
                    {
                        "index": float(g.get("index", i)),
                        **{k: float(g[k]) for k in ("util", "mem_used_mb", "mem_total_mb")},
                    }
                    for i, g in enumerate(record.get("gpus") or [])
                ],
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            result.bad_lines += 1
            continue
        result.samples.append(sample)
    return result
