"""What a run cost, as an estimate: node-hours x price, plus the head node and FSx over the run's window.

On-demand instance prices come from AWS's Price List API for the run's region (`price_list`, cached per
day) when it answers, else from the dated table bundled with pcflow (`pcflow.prices`), one
section per region (overridable per call); FSx and what a kept stack bills come from the table. A region
neither prices is unpriced (`NoPrices`), never priced as another region. A run on spot capacity is priced
from EC2's spot price history for its window when the API answers, else at the on-demand price less the
table's typical spot discount. Every figure says where it came from: its `source` is one of `SOURCES`,
its `basis` says which table, answer or day.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from pcflow.prices import bundled_prices, fsx_per_hour, price_table
from pcflow.pricing import price_list

CAPACITY_TYPES = ("ondemand", "spot")
#: Where a price came from: AWS's Price List API, EC2's spot price history, pcflow's bundled table.
SOURCES = ("price-list", "spot-history", "table")
log = logging.getLogger(__name__)


def run_prices(
    region: str,
    instance_types: Iterable[str | None],
    *,
    pricing: Any = None,
    overrides: Mapping[str, Any] | None = None,
    today: dt.date | None = None,
) -> dict[str, Any]:
    """`price_table` of a run: its instance types (compute, head node) asked of the Price List API when
    there is a `pricing` client (`price_list.pricing_client`), the table for what it does not answer."""
    if pricing is None:
        return price_table(overrides, region)
    listed = price_list.on_demand(pricing, region, [t for t in instance_types if t], today=today)
    found = {t: p for t, p in listed.prices.items() if p is not None}
    return price_table(overrides, region, listed=found, listed_on=listed.day)


@dataclass(frozen=True)
class Quote:
    """A price per hour, where it came from (one of `SOURCES`) and on what basis."""

    usd_per_hour: float
    source: str
    basis: str


def table_basis(table: Mapping[str, Any]) -> str:
    """Which table a price came from (region and date), for the `basis` every figure carries."""
    return f"{table.get('region')} price table as of {table.get('as_of')}"


def on_demand_quote(table: Mapping[str, Any], instance_type: str | None) -> Quote | None:
    """The type's on-demand price per hour in the prices of `price_table`, with its source; None if unpriced."""
    price = table.get("on_demand_per_hour", {}).get(instance_type)
    if price is None:
        return None
    listed = table.get("price_list") or {}
    if instance_type in listed.get("types", ()):
        return Quote(float(price), "price-list", f"AWS Price List API, {table.get('region')}, {listed.get('as_of')}")
    return Quote(float(price), "table", table_basis(table))


def sources_of(quotes: Iterable[Mapping[str, Any]]) -> list[str]:
    """The sources of priced lines, in `SOURCES` order."""
    used = {q["source"] for q in quotes}
    return [source for source in SOURCES if source in used]


@dataclass(frozen=True)
class CostInputs:
    """What a run used, as the estimate needs it: node-seconds of the compute type (spot or on-demand), the
    window the head node and FSx billed over, and the dates spot prices are looked up for. A capacity type
    other than the known ones is refused."""

    instance_type: str | None
    capacity_type: str = "ondemand"
    node_seconds: float | None = None
    window_s: float | None = None
    head_instance_type: str | None = None
    fsx_storage_gib: float | None = None
    fsx_deployment_type: str = "SCRATCH_2"
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    #: Where the compute ran when a capacity fallback named a zone (its spot price is that zone's); None: any zone.
    availability_zone: str | None = None

    def __post_init__(self) -> None:
        if self.capacity_type not in CAPACITY_TYPES:
            raise ValueError(f"capacity_type must be one of {CAPACITY_TYPES}, got {self.capacity_type!r}")


def spot_price(
    ec2: Any, instance_type: str, start: dt.datetime, end: dt.datetime, zone: str | None = None
) -> float | None:
    """Mean spot price of the type over [start, end] (in `zone`, else any zone), from EC2's price history;
    None when the history is empty or unreadable."""
    prices = spot_prices(ec2, instance_type, start, end, zone)
    return round(fmean(prices), 6) if prices else None


def spot_prices(
    ec2: Any, instance_type: str, start: dt.datetime, end: dt.datetime, zone: str | None = None
) -> list[float]:
    """Every spot price of the type in effect over [start, end] in the region's zones, or in `zone` alone
    (Linux), from EC2's price history; empty when there is none or the API refuses."""
    from botocore.exceptions import BotoCoreError, ClientError  # here: DAG files import this module

    prices: list[float] = []
    where = {"AvailabilityZone": zone} if zone else {}
    try:
        paginator = ec2.get_paginator("describe_spot_price_history")
        pages = paginator.paginate(
            InstanceTypes=[instance_type],
            ProductDescriptions=["Linux/UNIX"],
            StartTime=start - dt.timedelta(hours=1),
            EndTime=end,
            PaginationConfig={"MaxItems": 1000},
            **where,
        )
        for page in pages:
            # The zone is asked of EC2 and kept here too (an endpoint that ignores the filter answers every zone).
            prices += [
                float(p["SpotPrice"])
                for p in page.get("SpotPriceHistory", [])
                if p.get("SpotPrice") and zone in (None, p.get("AvailabilityZone"))
            ]
    except (ClientError, BotoCoreError) as exc:  # a missing permission, an unreachable endpoint: use the table
        log.warning("No spot price history for %s (%s); pricing it from the table instead", instance_type, exc)
        return []
    return prices


def _compute(inputs: CostInputs, table: Mapping[str, Any], ec2: Any) -> tuple[dict | None, dict | None, str]:
    """(bill line, spot savings, why unknown) of the compute nodes."""
    if inputs.node_seconds is None or not inputs.instance_type:
        return None, None, "compute (no node-hours or instance type)"
    node_hours = inputs.node_seconds / 3600
    on_demand = on_demand_quote(table, inputs.instance_type)
    if inputs.capacity_type == "ondemand":
        if on_demand is None:
            return None, None, f"compute ({inputs.instance_type} not in the price table)"
        return _line("compute (on-demand)", inputs.instance_type, node_hours, "node-hours", on_demand), None, ""
    zone = inputs.availability_zone
    history = (
        spot_price(ec2, inputs.instance_type, inputs.start, inputs.end, zone)
        if ec2 and inputs.start and inputs.end
        else None
    )
    basis = f"EC2 spot price history in {zone}" if zone else "EC2 spot price history"
    quote = Quote(history, "spot-history", basis) if history is not None else None
    if quote is None and on_demand is not None:
        discounted = round(on_demand.usd_per_hour * (1 - float(table.get("spot_discount_when_unknown", 0.7))), 6)
        quote = Quote(discounted, on_demand.source, f"{on_demand.basis}, less the typical spot discount")
    if quote is None:
        return None, None, f"compute ({inputs.instance_type}: no spot or on-demand price)"
    line = _line("compute (spot)", inputs.instance_type, node_hours, "node-hours", quote)
    saved = None
    if on_demand and on_demand.usd_per_hour:
        od_price, price = on_demand.usd_per_hour, quote.usd_per_hour
        saved = {"usd": round(node_hours * (od_price - price), 4), "percent": round(100 * (1 - price / od_price), 1)}
    return line, saved, ""


def estimate(inputs: CostInputs, table: Mapping[str, Any], *, ec2: Any = None) -> dict[str, Any]:
    """The bill of one run, labelled as an estimate; unknown parts are listed, never guessed as zero."""
    compute, saved, why = _compute(inputs, table, ec2)
    lines = [compute] if compute else []
    unknown = [why] if why else []
    window_h = inputs.window_s / 3600 if inputs.window_s is not None else None
    if inputs.head_instance_type and window_h is not None:
        head = on_demand_quote(table, inputs.head_instance_type)
        if head is None:
            unknown.append(f"head node ({inputs.head_instance_type} not in the price table)")
        else:
            lines.append(_line("head node", inputs.head_instance_type, window_h, "hours", head))
    if inputs.fsx_storage_gib and window_h is not None:
        price = fsx_per_hour(table, inputs.fsx_storage_gib, inputs.fsx_deployment_type)
        if price is None:
            unknown.append(f"FSx ({inputs.fsx_deployment_type} not in the price table)")
        else:
            item = f"{inputs.fsx_storage_gib:g} GiB {inputs.fsx_deployment_type}"
            lines.append(_line("FSx for Lustre", item, window_h, "hours", Quote(price, "table", table_basis(table))))
    return {
        "estimate": True,
        "currency": table.get("currency", "USD"),
        "price_table_as_of": table.get("as_of"),
        "price_list_as_of": (table.get("price_list") or {}).get("as_of"),
        "price_sources": sources_of(lines),
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
        "price_list_as_of": None,
        "price_sources": [],
        "capacity_type": inputs.capacity_type,
        "total_usd": None,
        "lines": [],
        "unknown": [why],
        "spot_savings": None,
    }


def _line(what: str, item: str, quantity: float, unit: str, quote: Quote) -> dict[str, Any]:
    return {
        "what": what,
        "item": item,
        "quantity": round(quantity, 6),
        "unit": unit,
        "price_per_hour": round(quote.usd_per_hour, 6),
        "usd": round(quantity * quote.usd_per_hour, 4),
        "source": quote.source,
        "basis": quote.basis,
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
    from pcflow.fsx import HEAD_NODE_INSTANCE_TYPE, FsxSpec  # pydantic: not at DAG parse

    head = settings.get("head_node_instance_type") or HEAD_NODE_INSTANCE_TYPE
    fsx = FsxSpec.model_validate(settings["fsx"]) if settings.get("fsx") else None
    if fsx is None:
        return Infrastructure(head)
    kind = fsx.deployment_type  # the price table names PERSISTENT_2 by its throughput per TiB
    if kind == "PERSISTENT_2":
        kind = f"PERSISTENT_2_{fsx.per_unit_storage_throughput}"
    return Infrastructure(head, float(fsx.storage_capacity_gib), kind)
