"""Headroom per pool, in req/s, rounded once: each risk is a scenario on the deployment, not a ceiling of its own.

A deployment has one pool (aggregated: "instances") or two (disaggregated: "prefill", "decode"), each
sized from the planning rate and its own per-instance max rate G (req/s, measured by simulation):
- traffic:    the planning rate λ is the target (the trace's mean, or given) — times (1 + forecast error)
              when `traffic_method` is forecast_error. Every scenario replays the whole trace at mean λ, so
              the trace's own bursts are in it (the report states its windowed-rate percentile); no peak
              factor is added on top.
- memory:     P99 KV tokens per instance at the operating point (the pool's max rate) must stay ≤
              kv_safe_fraction × capacity; when above, the pool carries λ × P99 / limit (spreading the same
              tokens over more instances). Applies in every scenario (aggregated and the decode pool).
- failure:    lose the worst `node_failures` node(s) given the placement (`llmcap.sizing.placement`: each pool
              on its own nodes), i.e. the instances of that pool on them; the rest must carry λ.
- deployment: a rolling upgrade of one pool at a time takes max_surge + max_unavailable of its instances
              out of service (surge: the new instance's GPUs, not yet serving; unavailable: down); the rest
              must carry λ.
- control:    0 for a static plan sized to the planning rate: reacting to a ramp is the autoscaler's job
              (its T_ready and the trace's largest rise are reported for it).
Combination: a node loss and a rolling upgrade do not coincide (an operator does not roll while a node is
out, and a node loss hits one pool), so per pool the survivors S = ⌈λ·m / G⌉ (m = memory factor ≥ 1: the
one rounding) must remain after the larger of the two outages: N = the smallest count with
N − max(node loss(N), upgrade) ≥ S. Nothing is summed across risks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
from numpy.typing import ArrayLike, NDArray

from llmcap.errors import LlmcapError
from llmcap.sizing.analytic import ceil_count, demand_growth, windowed_peak_rate
from llmcap.sizing.params import HeadroomParams
from llmcap.sizing.placement import Placement, place
from llmcap.trace.stats import window_counts
from llmcap.trace.synth import mean_rate, scale_rate

RISKS = ("traffic", "memory", "failure", "deployment", "control")


@dataclass(frozen=True)
class HeadroomItem:
    risk: str  # one of RISKS
    rps: float  # req/s of capacity this risk asks for beyond the target (traffic) or the planning rate (others)
    instances: int  # what it costs in whole instances of the pool (after the combination rule)
    reasoning: str


@dataclass(frozen=True)
class PoolInput:
    """One pool as measured: its per-instance max rate and what a node and an hour cost it."""

    name: str  # "instances" (aggregated) | "prefill" | "decode"
    per_instance_rps: float  # G: one instance's max feasible rate
    gpus_per_instance: int
    gpus_per_node: int
    usd_per_gpu_hour: float
    p99_kv_tokens: float | None = None  # per instance at the operating point; None: not measured (prefill)
    kv_tokens: float | None = None  # per-instance KV capacity


@dataclass(frozen=True)
class Traffic:
    target_rps: float
    planning_rps: float
    reasoning: str


def traffic_plan(target_rps: float, params: HeadroomParams, arrival_s: ArrayLike | None = None) -> Traffic:
    """The planning rate (module docstring) with what the replay at it already contains (`arrival_s`: the
    trace's arrivals on any clock; its full windows' rates are scaled so their mean is the planning rate)."""
    p = params
    if p.traffic_method == "forecast_error":
        lam = target_rps * (1 + p.forecast_error)
        why = f"forecast {target_rps:.4g} req/s × (1 + {p.forecast_error:g} error at the planning quantile) = {lam:.4g} req/s"
    else:
        lam = target_rps
        why = f"target {lam:.4g} req/s"
    if arrival_s is not None:
        counts = window_counts(np.sort(np.asarray(arrival_s, dtype=np.float64)), p.traffic_window_s)
        if counts.size:
            rates = counts / counts.mean() * lam  # the replay at mean λ: each full window's rate
            pct = float(np.percentile(rates, p.traffic_percentile))
            why += (
                f"; the whole-trace replay at that mean carries the trace's own bursts: {p.traffic_window_s:g} s windowed rate "
                f"p{p.traffic_percentile:g} {pct:.4g} req/s, max {float(rates.max()):.4g} req/s — no peak factor on top"
            )
    return Traffic(target_rps, lam, why)


def _memory_factor(pool: PoolInput, safe_fraction: float) -> tuple[float, str]:
    if pool.p99_kv_tokens is None or not pool.kv_tokens:
        return 1.0, "no KV measurement at the operating point (a prefill pool hands its KV off): not assessed"
    limit = safe_fraction * pool.kv_tokens
    p99 = pool.p99_kv_tokens
    if p99 <= limit:
        return (
            1.0,
            f"P99 KV tokens {p99:,.0f} ≤ {safe_fraction:g} × {pool.kv_tokens:,.0f} = {limit:,.0f} per instance at its max rate",
        )
    return p99 / limit, (
        f"P99 KV tokens {p99:,.0f} > {safe_fraction:g} × {pool.kv_tokens:,.0f} = {limit:,.0f} per instance at its max rate: "
        f"the pool carries λ × {p99:,.0f} / {limit:,.0f} = λ × {p99 / limit:.4g}"
    )


@dataclass(frozen=True)
class PoolPlan:
    pool: PoolInput
    target_rps: float
    planning_rps: float
    base_instances: int  # ⌈target / G⌉: the bare count at the mean rate, no risk
    survivors: int  # S = ⌈λ·m / G⌉: instances that must serve in every scenario
    instances: int  # N, the planned count
    items: tuple[HeadroomItem, ...]
    placement: Placement
    params: HeadroomParams

    @property
    def name(self) -> str:
        return self.pool.name

    @property
    def gpus(self) -> int:
        return self.instances * self.pool.gpus_per_instance

    @property
    def base_gpus(self) -> int:
        return self.base_instances * self.pool.gpus_per_instance

    @property
    def usd_per_hour(self) -> float:
        return self.gpus * self.pool.usd_per_gpu_hour

    @property
    def node_loss(self) -> int:
        return self.placement.lost(self.params.node_failures)

    @property
    def upgrading(self) -> int:
        return min(self.instances, self.params.max_surge + self.params.max_unavailable)

    def item(self, risk: str) -> HeadroomItem:
        return next(i for i in self.items if i.risk == risk)

    def combination(self) -> str:
        g = self.pool.per_instance_rps
        worst = max(self.node_loss, self.upgrading)
        return (
            f"survivors S = ceil({self.planning_rps:.4g} × memory / {g:.4g}) = {self.survivors}; N = {self.instances} with "
            f"max(node loss {self.node_loss}, upgrade {self.upgrading}) = {worst} out leaves {self.instances - worst} ≥ S "
            f"(capacity {self.instances * g:.4g} req/s, {(self.instances - worst) * g:.4g} in the worst outage)"
        )

    def with_instances(self, n: int) -> PoolPlan:
        """The same pool at `n` instances (after simulation added or removed some), re-placed."""
        return replace(
            self,
            instances=n,
            placement=place(n, self.pool.gpus_per_instance, self.pool.gpus_per_node, self.params.node_failures > 0),
        )


def plan_pool(
    traffic: Traffic, pool: PoolInput, params: HeadroomParams, growth_rps: float, growth_source: str
) -> PoolPlan:
    """One pool's count under the module docstring's scenarios and combination rule."""
    p, g = params, pool.per_instance_rps
    if g <= 0:
        raise LlmcapError(f"pool {pool.name}: per-instance capacity must be > 0 req/s to plan headroom")
    lam = traffic.planning_rps
    mem, mem_why = _memory_factor(pool, p.kv_safe_fraction)
    survivors = max(1, ceil_count(lam * mem / g))
    upgrade = p.max_surge + p.max_unavailable
    spread = p.node_failures > 0
    n = survivors + upgrade
    while (
        n - max(place(n, pool.gpus_per_instance, pool.gpus_per_node, spread).lost(p.node_failures), upgrade) < survivors
    ):
        n += 1
    placed = place(n, pool.gpus_per_instance, pool.gpus_per_node, spread)
    lost = placed.lost(p.node_failures)
    base = max(1, ceil_count(traffic.target_rps / g))
    out = n - survivors  # the larger outage, plus any slack the placement forces
    mem_n = survivors - max(1, ceil_count(lam / g))
    items = (
        HeadroomItem("traffic", lam - traffic.target_rps, max(1, ceil_count(lam / g)) - base, traffic.reasoning),
        HeadroomItem("memory", lam * (mem - 1), mem_n, mem_why),
        HeadroomItem(
            "failure",
            lost * g,
            out if lost >= upgrade else 0,
            f"{placed.describe()}; losing {p.node_failures} node(s) loses {lost} {pool.name} instance(s) = {lost * g:.4g} req/s; "
            f"the rest must carry {lam:.4g} req/s",
        ),
        HeadroomItem(
            "deployment",
            upgrade * g,
            out if upgrade > lost else 0,
            f"rolling upgrade of the {pool.name} pool, one step at a time: {p.max_surge} surge (GPUs for the new instance, not yet "
            f"serving) + {p.max_unavailable} unavailable = {upgrade} instance(s) = {upgrade * g:.4g} req/s out; the rest must carry {lam:.4g} req/s",
        ),
        HeadroomItem(
            "control",
            0.0,
            0,
            f"static plan sized to the planning rate: 0 (an autoscaler would need {growth_rps:.4g} req/s ready ahead — {growth_source} "
            f"within T_ready {p.ready_time_s:g} s)",
        ),
    )
    return PoolPlan(pool, traffic.target_rps, lam, base, survivors, n, items, placed, p)


COMBINATION_RULE = (
    "per pool: the planning-rate replay (its bursts included) with the larger of one node lost or one rolling-upgrade step "
    "out, never both (they do not coincide; a node loss hits one pool, an upgrade rolls one pool at a time); the memory "
    "limit holds in every scenario; control is the autoscaler's (0 here)"
)


@dataclass(frozen=True)
class CapacityPlan:
    """The deployment: its pools, each with base, headroom by risk and planned instances; cost."""

    target_rps: float
    planning_rps: float
    traffic_reasoning: str
    pools: tuple[PoolPlan, ...]

    @property
    def rate_rps(self) -> float:
        return self.target_rps

    @property
    def base_instances(self) -> int:
        return sum(p.base_instances for p in self.pools)

    @property
    def total_instances(self) -> int:
        return sum(p.instances for p in self.pools)

    @property
    def base_gpus(self) -> int:
        return sum(p.base_gpus for p in self.pools)

    @property
    def total_gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def usd_per_hour(self) -> float:
        return sum(p.usd_per_hour for p in self.pools)

    @property
    def gpu_hours_per_day(self) -> float:
        return self.total_gpus * 24.0

    @property
    def operational_margin(self) -> float:
        """Headroom GPUs as a share of the base GPUs (0.5 = 50% more than the bare minimum)."""
        return (self.total_gpus - self.base_gpus) / self.base_gpus if self.base_gpus else 0.0

    def pool(self, name: str) -> PoolPlan:
        return next(p for p in self.pools if p.name == name)

    def counts(self) -> dict[str, int]:
        return {p.name: p.instances for p in self.pools}

    def with_counts(self, counts: Mapping[str, int]) -> CapacityPlan:
        return replace(self, pools=tuple(p.with_instances(counts.get(p.name, p.instances)) for p in self.pools))


@dataclass(frozen=True)
class Demand:
    """What every plan for one trace and target shares: the planning traffic and the ramp an autoscaler would face."""

    traffic: Traffic
    growth_rps: float
    growth_source: str


def planning_demand(target_rps: float, params: HeadroomParams, arrival_s: ArrayLike | None = None) -> Demand:
    """`traffic_plan` and the ramp for `target_rps` (`arrival_s`: as in `plan_headroom`)."""
    p = params
    if p.ramp_rps_per_s is not None:
        growth, src = p.ramp_rps_per_s * p.ready_time_s, f"given ramp {p.ramp_rps_per_s:g} req/s²"
    elif arrival_s is not None:
        growth, src = (
            demand_growth(arrival_s, p.traffic_window_s, p.ready_time_s),
            f"the trace's largest {p.traffic_window_s:g} s-window rise",
        )
    else:
        growth, src = 0.0, "no ramp given and no arrivals"
    return Demand(traffic_plan(target_rps, p, arrival_s), growth, src)


@dataclass(frozen=True)
class PlanningTraffic:
    """One plan's traffic, derived once from its trace (`planning_traffic`) and handed to every step that needs it."""

    target_rps: float
    arrival_s: NDArray[np.float64]  # the trace's arrivals as replayed at the target (rate-scaled)
    demand: Demand

    @property
    def planning_rps(self) -> float:
        return self.demand.traffic.planning_rps

    def peak_rps(self, window_s: float) -> float:
        """The planning traffic's peak `window_s`-windowed rate: the bursts the replay at the planning rate carries."""
        return windowed_peak_rate(self.arrival_s, window_s) * self.planning_rps / self.target_rps


def planning_traffic(trace: pa.Table, target_rps: float | None, params: HeadroomParams) -> PlanningTraffic:
    """The planning traffic of `trace` at `target_rps` (None: the trace's own mean rate)."""
    target = target_rps if target_rps is not None else mean_rate(trace)
    arrivals = scale_rate(trace, target).column("arrival_s").to_numpy()
    return PlanningTraffic(target, arrivals, planning_demand(target, params, arrivals))


def plan_pools(demand: Demand, pools: list[PoolInput] | tuple[PoolInput, ...], params: HeadroomParams) -> CapacityPlan:
    """Each pool's count for `demand` under the scenarios of the module docstring."""
    t = demand.traffic
    return CapacityPlan(
        t.target_rps,
        t.planning_rps,
        t.reasoning,
        tuple(plan_pool(t, q, params, demand.growth_rps, demand.growth_source) for q in pools),
    )


def plan_headroom(
    target_rps: float,
    pools: list[PoolInput] | tuple[PoolInput, ...],
    params: HeadroomParams | None = None,
    arrival_s: ArrayLike | None = None,
) -> CapacityPlan:
    """Each pool's count for `target_rps` under the scenarios of the module docstring.

    `arrival_s`: the trace's arrivals as replayed at the target (rate-scaled), for the windowed-rate
    statement and the autoscaler's ramp.
    """
    p = params or HeadroomParams()
    return plan_pools(planning_demand(target_rps, p, arrival_s), pools, p)
