"""What a run cost, as an estimate: node-hours x price, plus the head node and FSx over the run's window.

Prices come from a dated table bundled with pcflow (pcflow/metrics/prices.json), one section per region
(overridable per call); a region the table lacks is unpriced (`NoPrices`), never priced as another
region. A run on spot capacity is priced from EC2's spot price history for its window when the API
answers, else at the table's on-demand price less its typical spot discount. Every figure says where
it came from.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from statistics import fmean
from typing import Any

CAPACITY_TYPES = ("ondemand", "spot")
log = logging.getLogger(__name__)


DEFAULT_REGION = "us-east-1"


class NoPrices(LookupError):
    """The price table has no section for the region: its runs cannot be priced from it."""


@cache
def bundled_prices() -> dict[str, Any]:
    return json.loads(resources.files("pcflow.metrics").joinpath("prices.json").read_text())


def price_table(overrides: Mapping[str, Any] | None = None, region: str = DEFAULT_REGION) -> dict[str, Any]:
    """The bundled prices of `region`, flat (`on_demand_per_hour`, `fsx_lustre_per_gib_month`, the dated
    `as_of`...), with `overrides` merged in (top-level keys; per-type maps merged one level). Raises
    `NoPrices` for a region the table lacks, unless `overrides` price the compute nodes."""
    bundled = bundled_prices()
    regional = bundled["regions"].get(region)
    if regional is None and not (overrides or {}).get("on_demand_per_hour"):
        priced = ", ".join(sorted(bundled["regions"]))
        raise NoPrices(
            f"the price table (pcflow/metrics/prices.json, as of {bundled['as_of']}) has no prices for region "
            f"{region} (it has {priced}); add the region's prices there"
        )
    common = {k: v for k, v in bundled.items() if k not in ("regions", "_about")}
    table = json.loads(json.dumps({**common, "region": region, **(regional or {})}))
    for key, value in (overrides or {}).items():
        if isinstance(value, Mapping) and isinstance(table.get(key), dict):
            table[key].update(value)
        else:
            table[key] = value
    return table


@dataclass(frozen=True)
class CostInputs:
    instance_type: str | None
    capacity_type: str = "ondemand"
    node_seconds: float | None = None
    window_s: float | None = None
    head_instance_type: str | None = None
    fsx_storage_gib: float | None = None
    fsx_deployment_type: str = "SCRATCH_2"
    start: dt.datetime | None = None
    end: dt.datetime | None = None

    def __post_init__(self) -> None:
        if self.capacity_type not in CAPACITY_TYPES:
            raise ValueError(f"capacity_type must be one of {CAPACITY_TYPES}, got {self.capacity_type!r}")


def spot_price(ec2: Any, instance_type: str, start: dt.datetime, end: dt.datetime) -> float | None:
    """Mean spot price of the type over [start, end] (any zone), from EC2's price history; None when
    the history is empty or unreadable."""
    prices = spot_prices(ec2, instance_type, start, end)
    return round(fmean(prices), 6) if prices else None


def spot_prices(ec2: Any, instance_type: str, start: dt.datetime, end: dt.datetime) -> list[float]:
    """Every spot price of the type in effect over [start, end] in the region's zones (Linux), from
    EC2's price history; empty when there is none or the API refuses."""
    from botocore.exceptions import BotoCoreError, ClientError  # here: DAG files import this module

    prices: list[float] = []
    try:
        paginator = ec2.get_paginator("describe_spot_price_history")
        pages = paginator.paginate(
            InstanceTypes=[instance_type],
            ProductDescriptions=["Linux/UNIX"],
            StartTime=start - dt.timedelta(hours=1),
            EndTime=end,
            PaginationConfig={"MaxItems": 1000},
        )
        for page in pages:
            prices += [float(p["SpotPrice"]) for p in page.get("SpotPriceHistory", []) if p.get("SpotPrice")]
    except (ClientError, BotoCoreError) as exc:  # a missing permission, an unreachable endpoint: use the table
        log.warning("No spot price history for %s (%s); pricing it from the table instead", instance_type, exc)
        return []
    return prices


def _compute(inputs: CostInputs, table: Mapping[str, Any], ec2: Any) -> tuple[dict | None, dict | None, str]:
    """(bill line, spot savings, why unknown) of the compute nodes."""
    on_demand = table.get("on_demand_per_hour", {})
    if inputs.node_seconds is None or not inputs.instance_type:
        return None, None, "compute (no node-hours or instance type)"
    node_hours = inputs.node_seconds / 3600
    od_price = on_demand.get(inputs.instance_type)
    table_source = f"on-demand table ({table.get('as_of')})"
    if inputs.capacity_type == "ondemand":
        if od_price is None:
            return None, None, f"compute ({inputs.instance_type} not in the price table)"
        line = _line("compute (on-demand)", node_hours, "node-hours", od_price, table_source, inputs.instance_type)
        return line, None, ""
    price = (
        spot_price(ec2, inputs.instance_type, inputs.start, inputs.end) if ec2 and inputs.start and inputs.end else None
    )
    source = "EC2 spot price history"
    if price is None and od_price is not None:
        price = round(od_price * (1 - float(table.get("spot_discount_when_unknown", 0.7))), 6)
        source = f"{table_source} less the typical spot discount"
    if price is None:
        return None, None, f"compute ({inputs.instance_type}: no spot or on-demand price)"
    line = _line("compute (spot)", node_hours, "node-hours", price, source, inputs.instance_type)
    saved = None
    if od_price:
        saved = {"usd": round(node_hours * (od_price - price), 4), "percent": round(100 * (1 - price / od_price), 1)}
    return line, saved, ""


def estimate(inputs: CostInputs, table: Mapping[str, Any], *, ec2: Any = None) -> dict[str, Any]:
    """The bill of one run, labelled as an estimate; unknown parts are listed, never guessed as zero."""
    on_demand = table.get("on_demand_per_hour", {})
    compute, saved, why = _compute(inputs, table, ec2)
    lines = [compute] if compute else []
    unknown = [why] if why else []
    window_h = inputs.window_s / 3600 if inputs.window_s is not None else None
    if inputs.head_instance_type and window_h is not None:
        price = on_demand.get(inputs.head_instance_type)
        if price is None:
            unknown.append(f"head node ({inputs.head_instance_type} not in the price table)")
        else:
            source = f"on-demand table ({table.get('as_of')})"
            lines.append(_line("head node", window_h, "hours", price, source, inputs.head_instance_type))
    if inputs.fsx_storage_gib and window_h is not None:
        price = fsx_per_hour(table, inputs.fsx_storage_gib, inputs.fsx_deployment_type)
        if price is None:
            unknown.append(f"FSx ({inputs.fsx_deployment_type} not in the price table)")
        else:
            item = f"{inputs.fsx_storage_gib:g} GiB {inputs.fsx_deployment_type}"
            lines.append(_line("FSx for Lustre", window_h, "hours", price, "price table", item))
    return {
        "estimate": True,
        "currency": table.get("currency", "USD"),
        "price_table_as_of": table.get("as_of"),
        "capacity_type": inputs.capacity_type,
        "total_usd": round(sum(line["usd"] for line in lines), 4) if lines else None,
        "lines": lines,
        "unknown": unknown,
        "spot_savings": saved,
    }


def unpriced(inputs: CostInputs, why: str) -> dict[str, Any]:
    """The bill of a run nothing could price (a region the table lacks): unknown, and why."""
    bundled = bundled_prices()
    return {
        "estimate": True,
        "currency": bundled.get("currency", "USD"),
        "price_table_as_of": bundled.get("as_of"),
        "capacity_type": inputs.capacity_type,
        "total_usd": None,
        "lines": [],
        "unknown": [why],
        "spot_savings": None,
    }


def _line(what: str, quantity: float, unit: str, price: float, source: str, item: str) -> dict[str, Any]:  # noqa: PLR0917
    return {
        "what": what,
        "item": item,
        "quantity": round(quantity, 6),
        "unit": unit,
        "price_per_hour": round(price, 6),
        "usd": round(quantity * price, 4),
        "source": source,
    }


@dataclass(frozen=True)
class Infrastructure:
    """What a cluster bills for while it exists, besides its compute nodes: the head node and FSx."""

    head_instance_type: str | None = None
    fsx_storage_gib: float | None = None
    fsx_deployment_type: str = "SCRATCH_2"


def cluster_infrastructure(provider: str | None, settings: Mapping[str, Any] | None) -> Infrastructure:
    """The head node type and FSx of ParallelCluster settings (the cluster stage's, or a profile's
    `cluster.config`); a static cluster has none pcflow pays for. Raises ValueError for settings
    that do not parse."""
    if provider != "parallelcluster" or not settings:
        return Infrastructure()
    from pcflow.cluster.spec import ClusterSpec, FsxSpec  # pydantic: not at DAG parse

    head = settings.get("head_node_instance_type") or ClusterSpec.model_fields["head_node_instance_type"].default
    fsx = FsxSpec.model_validate(settings["fsx"]) if settings.get("fsx") else None
    if fsx is None:
        return Infrastructure(head)
    kind = fsx.deployment_type  # the price table names PERSISTENT_2 by its throughput per TiB
    if kind == "PERSISTENT_2":
        kind = f"PERSISTENT_2_{fsx.per_unit_storage_throughput}"
    return Infrastructure(head, float(fsx.storage_capacity_gib), kind)


def fsx_per_hour(table: Mapping[str, Any], gib: float, deployment_type: str) -> float | None:
    """FSx for Lustre's price per hour for `gib` of `deployment_type`; None when the table lacks it."""
    per_month = table.get("fsx_lustre_per_gib_month", {}).get(deployment_type)
    if per_month is None:
        return None
    return gib * float(per_month) / float(table.get("hours_per_month", 730))
