"""What a run may cost, known before anything is created: its price per hour and its maximum, against its
budget.

The first task prices the run for its region from AWS's Price List API (on-demand instances, cached per
day; pcflow.pricing.price_list), its dated price table (pcflow/prices.json: FSx, and what the API
does not answer) and, for spot capacity, EC2's spot price history: the compute nodes (nodes x type), and
for ParallelCluster the head node and FSx for Lustre. Each price says its source (`price-list`,
`spot-history`, `table`). The maximum is that price per hour over the job's time limit, once per attempt
Slurm may make (the first and `training.max_restarts` requeues) and per trial of a sweep, plus the head
node and FSx while the cluster is created and deleted. A run whose maximum is above its budget is refused
(unless the profile lets it start capped); above the profile's approval threshold it waits for a person's
approval. What this does not see (the image bake, the data load, time pending) is what the train task's
cap catches: it counts the cost so far from the same prices (`cost_so_far`) and cancels the job when it
reaches the budget.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pcflow.capacity import PlannedOption
from pcflow.errors import ConfigurationError
from pcflow.jobstates import JobInfo, JobState
from pcflow.patterns import ABSURD_USD, time_limit_seconds  # noqa: F401 - ABSURD_USD: where callers found it
from pcflow.prices import NoPrices, fsx_per_hour
from pcflow.pricing.cost import (
    cluster_infrastructure,
    on_demand_quote,
    run_prices,
    sources_of,
    spot_prices,
    table_basis,
)

if TYPE_CHECKING:
    from pcflow.resolved import PlannedRun

#: How far back the spot price history is read: the highest price of the last day, in any zone.
SPOT_HISTORY = dt.timedelta(days=1)


class BudgetRefused(ConfigurationError):
    """The run may cost more than its budget, or cannot be priced while it has one."""


@dataclass(frozen=True)
class Price:
    """One priced item of a run (per hour) with where the price came from, so every figure the first task shows
    can be checked."""

    usd_per_hour: float
    source: str  # one of pcflow.pricing.cost.SOURCES
    item: str
    basis: str  # which table, answer or day


def usd(amount: float | None) -> str:
    """Money as a person reads it: cents, or two significant digits below a cent."""
    if amount is None:
        return "unknown"
    return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.2g}"


@dataclass(frozen=True)
class Estimate:
    """What pricing a run gives the first task: the run's `cost` section, and its capacity options each with
    its price per node-hour (the `capacity_order` the resolved run carries; the planned run is not changed)."""

    cost: dict[str, Any]
    capacity_order: list[PlannedOption]


def capacity_options(run: PlannedRun) -> list[PlannedOption]:
    """The run's capacity options in order (pcflow.capacity; the first task's `capacity_order`), or its
    one instance type and capacity type where the run has none."""
    return list(run.capacity_order) or [
        PlannedOption(instance_types=[run.instance_type], capacity_type=run.capacity_type)
    ]


def price_options(
    options: Iterable[PlannedOption], table: Mapping[str, Any], ec2: Any, now: dt.datetime
) -> list[tuple[PlannedOption, Price]] | None:
    """Each option with the price of its dearest instance type (`type_price`), never under-estimated: the
    option carries it as `usd_per_node_hour`. None when a type has no price (the run then cannot be priced)."""
    priced = []
    for option in options:
        prices = [type_price(t, option.capacity_type, table, ec2, now) for t in option.instance_types]
        if any(p is None for p in prices):
            return None
        top = max(prices, key=lambda p: p.usd_per_hour)  # type: ignore[union-attr]
        priced.append((option.model_copy(update={"usd_per_node_hour": top.usd_per_hour}), top))  # type: ignore[union-attr]
    return priced


def dearest(priced: list[tuple[PlannedOption, Price]] | None) -> tuple[PlannedOption, Price] | None:
    """The option whose price bounds one compute node's (a fallback's on-demand may be above the run's spot),
    with that price; the first of equals. None when the options could not be priced."""
    if not priced:
        return None
    option, price = max(priced, key=lambda pair: pair[1].usd_per_hour)
    if len(priced) + len(priced[0][0].instance_types) > 2:
        price = Price(
            price.usd_per_hour, price.source, price.item, f"the dearest of the run's capacity options; {price.basis}"
        )
    return option, price


def type_price(
    instance_type: str, capacity_type: str, table: Mapping[str, Any], ec2: Any, now: dt.datetime
) -> Price | None:
    """One instance type's price per hour: on-demand from the Price List API or the table; spot at the
    highest price of the last day in the region's zones (EC2's history), else at on-demand (what spot never
    exceeds by default)."""
    on_demand = on_demand_quote(table, instance_type)
    if capacity_type == "spot":
        history = spot_prices(ec2, instance_type, now - SPOT_HISTORY, now) if ec2 is not None else []
        if history:
            basis = "highest spot price of the last day, EC2 spot price history"
            return Price(max(history), "spot-history", instance_type, basis)
        if on_demand is not None:
            basis = f"on-demand, no spot price history; {on_demand.basis}"
            return Price(on_demand.usd_per_hour, on_demand.source, instance_type, basis)
        return None
    return Price(on_demand.usd_per_hour, on_demand.source, instance_type, on_demand.basis) if on_demand else None


def infrastructure_prices(run: PlannedRun, table: Mapping[str, Any]) -> tuple[list[Price], list[str]]:
    """The head node and FSx, priced while the cluster exists; and what the prices do not cover."""
    infra = cluster_infrastructure(run.cluster.provider, run.cluster.config)
    prices, unknown = [], []
    if infra.head_instance_type:
        head = on_demand_quote(table, infra.head_instance_type)
        if head is None:
            unknown.append(f"head node {infra.head_instance_type}")
        else:
            item = f"head node {infra.head_instance_type}"
            prices.append(Price(head.usd_per_hour, head.source, item, head.basis))
    if infra.fsx_storage_gib:
        fsx = fsx_per_hour(table, infra.fsx_storage_gib, infra.fsx_deployment_type)
        item = f"FSx {infra.fsx_storage_gib:g} GiB {infra.fsx_deployment_type}"
        if fsx is None:
            unknown.append(item)
        else:
            prices.append(Price(fsx, "table", item, table_basis(table)))
    return prices, unknown


def plan_cost(run: PlannedRun, *, ec2: Any = None, pricing: Any = None, now: dt.datetime | None = None) -> Estimate:
    """The run's `cost` section (price per hour, maximum, budget, approval, and one line that says it all) and
    its capacity options priced. `pricing`: a Price List API client (`price_list.pricing_client`); without
    one, the table prices."""
    budget, training, now = run.budget, run.training, now or dt.datetime.now(dt.UTC)
    head = cluster_infrastructure(run.cluster.provider, run.cluster.config).head_instance_type
    options, priced_options = capacity_options(run), None
    try:
        types = [t for option in options for t in option.instance_types]
        table = run_prices(run.region, [*dict.fromkeys(types), head], pricing=pricing, today=now.date())
    except NoPrices as exc:
        table, unknown, infra = {}, [str(exc)], []
    else:
        priced_options = price_options(options, table, ec2, now)
        infra, unknown = infrastructure_prices(run, table)
        if priced_options is None:
            nor = "the AWS Price List API nor " if pricing is not None else ""
            unknown.insert(0, f"{run.instance_type} (not in {nor}the {run.region} price table)")
    top = dearest(priced_options)
    compute = top[1] if top else None
    limit_s = time_limit_seconds(training.allocation.get("time_limit"))
    priced = ([compute] if compute else []) + infra
    cost = {
        "region": run.region,
        "currency": "USD",
        "price_table_as_of": table.get("as_of"),
        "price_list_as_of": (table.get("price_list") or {}).get("as_of"),
        "capacity_type": run.capacity_type,
        "priced_capacity_type": top[0].capacity_type if top else run.capacity_type,
        "nodes": training.nodes,
        "compute_per_node_hour": compute.usd_per_hour if compute else None,
        "infrastructure_per_hour": round(sum(p.usd_per_hour for p in infra), 6),
        "prices": [vars(p) for p in priced],
        "price_sources": sources_of(vars(p) for p in priced),
        "time_limit_hours": limit_s / 3600 if limit_s is not None else None,
        "attempts": training.max_restarts + 1,
        "trials": run.trial_count,
        "trials_at_once": run.sweep.parallel,
        "cluster_hours": (budget.create_minutes + budget.delete_minutes) / 60 if infra else 0.0,
        "unknown": unknown,
        "budget_usd": budget.usd,
        "if_maximum_exceeds": budget.if_maximum_exceeds,
        "report_every_s": budget.report_every_s,
    }
    cost["per_hour"] = per_hour(cost)
    cost["maximum_usd"] = maximum(cost)
    above = budget.approval_above_usd
    needed = above is not None and (cost["maximum_usd"] is None or cost["maximum_usd"] > above)
    cost["approval"] = {
        "above_usd": above,
        "needed": needed,
        "timeout_hours": budget.approval_timeout_hours,
        "approvers": [approver.model_dump(mode="json") for approver in budget.approvers],
    }
    cost["summary"] = summary(cost)
    order = [option for option, _ in priced_options] if priced_options and run.capacity_order else run.capacity_order
    return Estimate(cost, list(order))


def per_hour(cost: Mapping[str, Any]) -> float | None:
    """What the whole run costs per hour while its job runs: compute nodes, head node, FSx."""
    if cost["compute_per_node_hour"] is None or cost["unknown"]:
        return None
    return round(cost["compute_per_node_hour"] * cost["nodes"] + cost["infrastructure_per_hour"], 6)


def maximum(cost: Mapping[str, Any]) -> float | None:
    """The compute nodes' price x time limit x attempts x trials, the head node and FSx over the waves of trials
    (`waves`), plus both while the cluster is created and deleted; None when a price or the time limit is
    unknown (nothing then bounds the run). Each attempt may run the whole time limit: Slurm requeues a job (a
    lost node, a spot interruption) up to `max_restarts` times before pcflow cancels it, and every attempt is
    billed. Every trial's nodes are billed whether the trials run together or not; what running them at once
    saves is the shared head node's and FSx's time."""
    if cost["per_hour"] is None or cost["time_limit_hours"] is None:
        return None
    longest = cost["time_limit_hours"] * cost.get("attempts", 1)  # one trial, every attempt
    compute = cost["compute_per_node_hour"] * cost["nodes"] * longest * cost["trials"]
    shared = cost["infrastructure_per_hour"] * (longest * waves(cost) + cost["cluster_hours"])
    return round(compute + shared, 4)


def waves(cost: Mapping[str, Any]) -> int:
    """How many trial-lengths the trials take at most, `trials_at_once` of them at a time: ceil(trials / at
    once). A throttled array starts the next trial as soon as one ends, so by the end of the k-th longest
    trial-length at least k x `trials_at_once` trials have ended (1 trial: 1 wave)."""
    return math.ceil(cost["trials"] / max(1, cost.get("trials_at_once", 1)))


def summary(cost: Mapping[str, Any]) -> str:
    """One line a person reads: the maximum, the budget, and how the maximum was reached."""
    budget = f"budget {usd(cost['budget_usd'])}" if cost["budget_usd"] is not None else "no budget"
    if cost["unknown"]:
        return f"Cost of this run: unknown ({budget}): no price for {'; '.join(cost['unknown'])}"
    if cost["maximum_usd"] is None:
        return f"Cost of this run: no maximum ({budget}): {breakdown(cost)}"
    return f"Cost of this run: up to {usd(cost['maximum_usd'])} ({budget}): {breakdown(cost)}"


def breakdown(cost: Mapping[str, Any]) -> str:
    """How the maximum is reached: price per hour and what makes it, hours, trials, the cluster's life."""
    compute, *infra = cost["prices"]
    capacity = "spot" if cost.get("priced_capacity_type", cost["capacity_type"]) == "spot" else "on-demand"
    parts = [f"{cost['nodes']} x {compute['item']} {capacity} at {usd(compute['usd_per_hour'])}/h"]
    parts += [f"{p['item']} {usd(p['usd_per_hour'])}/h" for p in infra]
    text = f"{usd(cost['per_hour'])}/h ({', '.join(parts)})"
    if cost["time_limit_hours"] is None:
        text += " with no time limit"
    else:
        text += f" x {cost['time_limit_hours']:g} h time limit"
        text += f" x {cost['trials']} trials" if cost["trials"] > 1 else ""
        restarts = cost.get("attempts", 1) - 1
        text += f" x {restarts + 1} attempts (up to {restarts} requeues)" if restarts else ""
        text += trials_at_once_note(cost)
    if cost["cluster_hours"]:
        text += (
            f" + {usd(cost['infrastructure_per_hour'])}/h x {cost['cluster_hours']:g} h while the cluster is "
            "created and deleted"
        )
    sources = dict.fromkeys(f"{p['source']} ({p['basis']})" if p.get("basis") else p["source"] for p in cost["prices"])
    return f"{text}; prices: {', '.join(sources)}"


def trials_at_once_note(cost: Mapping[str, Any]) -> str:
    """What running a sweep's trials side by side changes in the maximum: every trial's nodes are still
    counted, the head node and FSx only for the waves of trials; "" for trials one after another."""
    at_once = cost.get("trials_at_once", 1)
    if at_once <= 1:
        return ""
    note = f", {at_once} trials at once"
    if cost["infrastructure_per_hour"]:
        note += f" (the head node and FSx for {waves(cost)} of the {cost['trials']} trial-lengths)"
    return note


def refuse_over_budget(cost: Mapping[str, Any], run: PlannedRun) -> None:
    """Raise BudgetRefused when the run has a budget it may exceed, or that cannot cap it (an unknown
    price, no time limit); a profile with `if_maximum_exceeds: cap` lets it start, capped by its train task."""
    budget = cost["budget_usd"]
    if budget is None:
        return
    if cost["unknown"]:
        raise BudgetRefused(
            f"budget.usd: this run has a budget of {usd(budget)}, but it cannot be priced: no price for "
            f"{'; '.join(cost['unknown'])}. An unknown price cannot be capped: choose a priced instance type or "
            "region, or add the price to pcflow's table (plugins/pcflow/prices.json, in a pcflow release)"
        )
    if cost["maximum_usd"] is None:
        raise BudgetRefused(
            f"training.time_limit: not set, so nothing bounds what this run may cost, and its budget of "
            f"{usd(budget)} cannot be checked before it starts; the deployment admin sets a time limit in the profile"
        )
    if cost["maximum_usd"] > budget and cost["if_maximum_exceeds"] == "refuse":
        raise BudgetRefused(
            f"budget.usd: this run may cost up to {usd(cost['maximum_usd'])}, more than its budget of "
            f"{usd(budget)}: {breakdown(cost)}. {what_to_change(cost, run)}"
        )


def what_to_change(cost: Mapping[str, Any], run: PlannedRun) -> str:
    """The levers of the maximum, with their values now."""
    training = run.training
    levers = [f"fewer nodes (now {training.nodes})"]
    if cost["trials"] > 1:
        levers.append(f"fewer trials (now {cost['trials']})")
    if cost.get("attempts", 1) > 1:
        levers.append(f"fewer requeues (training.max_restarts, now {cost['attempts'] - 1}; the admin's)")
    if run.capacity_type == "ondemand":
        levers.append("spot capacity")
    levers.append(f"a cheaper instance type than {run.instance_type}")
    levers.append(f"a shorter training.time_limit (now {training.allocation.get('time_limit')}; the admin's)")
    ceiling = run.budget.max_usd
    raise_to = f"up to {usd(ceiling)}, the profile's budget.max_usd" if ceiling is not None else "within the profile"
    return f"To run it: {', '.join(levers)}; or raise the budget (form field 'Budget (USD)', {raise_to})."


def cost_so_far(cost: Mapping[str, Any], *, node_seconds: float, run_seconds: float) -> float:
    """What the run has cost until now, from the prices it was checked with: the compute nodes' time in
    jobs, and the head node and FSx since the run began."""
    compute = (cost["compute_per_node_hour"] or 0.0) * node_seconds / 3600
    return compute + cost["infrastructure_per_hour"] * run_seconds / 3600


def checkpoint_costs(
    cost: Mapping[str, Any],
    points: list[list[Any]],
    *,
    job_start: dt.datetime | None,
    run_start: dt.datetime | None,
) -> list[dict[str, Any]]:
    """The cost so far at each evaluation of the objective (the payload checkpoints with each): its
    nodes' time since the job's (latest attempt's) start and the head node and FSx since the run began.
    `points` are the objective's `[step, epoch, time, value]`; empty when the times are unknown."""
    if not points or job_start is None or cost.get("compute_per_node_hour") is None:
        return []
    run_start = run_start or job_start
    rows = []
    for step, epoch, when, value in points:
        if when is None:
            continue
        moment = dt.datetime.fromtimestamp(when, dt.UTC)
        node_seconds = max(0.0, (moment - job_start).total_seconds()) * cost["nodes"]
        run_seconds = max(0.0, (moment - run_start).total_seconds())
        so_far = cost_so_far(cost, node_seconds=node_seconds, run_seconds=run_seconds)
        rows.append({"step": step, "epoch": epoch, "time": when, "value": value, "usd": round(so_far, 6)})
    return rows


# -- during the run: the train task's wait meters the cost so far and stops the job at the budget --------


@dataclass
class _Attempt:
    restarts: int
    node_seconds: float  # as of the answer
    seen: float  # wall clock of the answer
    running: bool


@dataclass
class CostMeter:
    """The cost so far of a run's job (or job array), from the prices the first task checked: its nodes'
    time in the job as Slurm reports it (requeued attempts included), extrapolated between answers, and
    the head node and FSx since the run began. I/O free: the wait feeds it Slurm's answers and the clock.

    `cost` is the first task's cost section; `run_started` the run's start (epoch seconds); `jobs` how
    many jobs it watches (an array's elements), `at_most` how many of them may run at once (the array's `%`
    throttle; None: all)."""

    cost: Mapping[str, Any]
    run_started: float
    jobs: int = 1
    report_every_s: float = 300.0
    at_most: int | None = None
    banked: float = 0.0  # node-seconds of attempts and jobs that are over
    attempts: dict[str, _Attempt] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    next_report: float | None = None
    answered: bool = False  # Slurm has answered once: before, a job may have run since its submission

    @property
    def budget(self) -> float | None:
        return self.cost.get("budget_usd")

    def observe(self, infos: Iterable[JobInfo], wall: float) -> None:
        """Slurm's answer about the jobs (each job or array element once) at `wall`."""
        nodes = self.cost["nodes"]
        self.answered = True
        for info in infos:
            if info.job_id in self.ended:
                continue
            seen = self.attempts.get(info.job_id)
            if seen is not None and info.restarts > seen.restarts:
                self.banked += seen.node_seconds  # a requeued attempt was paid for too
            node_seconds = (info.elapsed_s or 0) * nodes
            if info.state.is_terminal:
                self.banked += node_seconds
                self.attempts.pop(info.job_id, None)
                self.ended.add(info.job_id)
            else:
                running = info.state is JobState.RUNNING
                self.attempts[info.job_id] = _Attempt(info.restarts, node_seconds, wall, running)

    def node_seconds(self, wall: float) -> float:
        """Node-seconds so far: attempts that are over, plus each running one extrapolated from Slurm's last
        answer to `wall`."""
        running = sum(a.node_seconds + (wall - a.seen) * self.cost["nodes"] * a.running for a in self.attempts.values())
        return self.banked + running

    def so_far(self, wall: float) -> float:
        """The run's cost so far at `wall`: its nodes' time, and the head node and FSx since the run began."""
        return cost_so_far(self.cost, node_seconds=self.node_seconds(wall), run_seconds=wall - self.run_started)

    def exhausted(self, wall: float) -> bool:
        """Whether the cost so far has reached the budget (never, without one): the wait then cancels the job."""
        return self.budget is not None and self.so_far(wall) >= self.budget

    def ask_within(self, wall: float) -> float | None:
        """Seconds before Slurm must be asked again: the soonest the budget could be reached if every job
        not known to run started now (None: the running ones' extrapolation tells the moment alone)."""
        waiting = self.jobs - len(self.ended) - sum(a.running for a in self.attempts.values())
        if self.budget is None or waiting <= 0:
            return None
        if not self.answered:
            return 0.0
        at_once = min(self.jobs, self.at_most or self.jobs)
        per_second = (self.cost["compute_per_node_hour"] or 0.0) * self.cost["nodes"] * at_once
        per_second = (per_second + self.cost["infrastructure_per_hour"]) / 3600
        return max(0.0, (self.budget - self.so_far(wall)) / per_second) if per_second > 0 else None

    def report(self, wall: float) -> str | None:
        """A line for the task log, once every `report_every_s`."""
        if self.next_report is not None and wall < self.next_report:
            return None
        self.next_report = wall + self.report_every_s
        so_far, budget = self.so_far(wall), self.budget
        share = f" of the {usd(budget)} budget ({100 * so_far / budget:.0f}%)" if budget else " (no budget)"
        line = (
            f"Cost so far: {usd(so_far)}{share}: {self.node_seconds(wall) / 3600:.3f} node-hours at "
            f"{usd(self.cost['compute_per_node_hour'])}/h"
        )
        if self.cost["infrastructure_per_hour"]:
            line += (
                f", {(wall - self.run_started) / 3600:.2f} h of head node and FSx at "
                f"{usd(self.cost['infrastructure_per_hour'])}/h"
            )
        return line

    def record(self, job_id: str, wall: float) -> dict[str, Any]:
        """What the stop record (pcflow.readings.stopping.BUDGET_FILE) says: which job, the budget, the cost so
        far and when."""
        return {
            "job_id": job_id,
            "budget_usd": self.budget,
            "cost_usd": round(self.so_far(wall), 6),
            "time": wall,
            "node_seconds": round(self.node_seconds(wall), 3),
        }
