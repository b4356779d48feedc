"""Headroom by risk: each risk is its own computed number of instances, with the arithmetic as its reason.

With λ the planning rate, G one instance's max feasible rate (req/s, from the search), g its GPUs and
N_base = ceil(λ / G):
- traffic:    N_peak = ceil(λ·f / G), f = windowed peak-to-mean of the trace (or 1 + forecast error);
              adds N_peak − N_base.
- failure:    losing k nodes must leave N_peak whole instances. g ≤ node size n: a node holds ⌊n/g⌋
              instances (n mod g GPUs stranded: TP does not span nodes), so the worst loss is k·⌊n/g⌋;
              g > n: an instance spans ⌈g/n⌉ whole nodes, each lost node kills at most one instance → k.
- deployment: a rolling upgrade needs max_surge extra instances' GPUs, and max_unavailable instances
              are down at once → max_surge + max_unavailable.
- memory:     P99 active KV tokens per instance (at N_peak) must stay ≤ kv_safe_fraction × KV capacity;
              spreading the same tokens over more instances: ceil(N_peak · P99 / limit) − N_peak when above.
- control:    demand grows by ΔR while a new instance becomes ready: ceil(ΔR / G), ΔR = the trace's largest
              rise of the windowed rate within T_ready (or a given ramp × T_ready).
The total is N_base + every risk's instances. Risks are summed, not maxed: they can coincide (a node dies
mid-upgrade during a burst), and the sum is the number an operator can defend line by line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from numpy.typing import ArrayLike

from llmcap.errors import LlmcapError
from llmcap.sizing.analytic import ceil_count, demand_growth, peak_to_mean
from llmcap.sizing.params import HeadroomParams


@dataclass(frozen=True)
class HeadroomItem:
    risk: str  # "traffic" | "failure" | "deployment" | "memory" | "control"
    instances: int
    reasoning: str


def traffic_headroom(rate_rps: float, per_instance_rps: float, factor: float, source: str) -> HeadroomItem:
    base = ceil_count(rate_rps / per_instance_rps)
    peak = ceil_count(rate_rps * factor / per_instance_rps)
    why = (
        f"{source}: factor {factor:.4g}; peak {rate_rps:g} × {factor:.4g} = {rate_rps * factor:.4g} req/s needs "
        f"ceil({rate_rps * factor:.4g} / {per_instance_rps:.4g}) = {peak} instances vs base {base}"
    )
    return HeadroomItem("traffic", peak - base, why)


def failure_headroom(peak_instances: int, gpus_per_instance: int, gpus_per_node: int, node_failures: int) -> HeadroomItem:
    g, n, k = gpus_per_instance, gpus_per_node, node_failures
    if k == 0 or peak_instances == 0:
        return HeadroomItem("failure", 0, "no node failures planned for")
    if g <= n:
        per_node = n // g
        on_one_node = min(per_node, peak_instances)  # a deployment smaller than a node puts its spare elsewhere
        lost = k * on_one_node
        stranded = n - per_node * g
        why = (
            f"a {n}-GPU node holds {n} // {g} = {per_node} instance(s) ({stranded} GPU(s) stranded: instances do "
            f"not span nodes), of the {peak_instances} needed at most {on_one_node} share one node; losing {k} node(s) "
            f"loses {k} × {on_one_node} = {lost} instance(s)"
        )
    else:
        span = math.ceil(g / n)
        lost = k
        why = f"an instance spans ceil({g} / {n}) = {span} nodes; losing {k} node(s) loses at most {k} instance(s)"
    return HeadroomItem("failure", lost, why + f"; {peak_instances} must remain → +{lost}")


def deployment_headroom(max_surge: int, max_unavailable: int) -> HeadroomItem:
    n = max_surge + max_unavailable
    why = (
        f"rolling upgrade: {max_surge} surge instance(s) need GPUs to start on, {max_unavailable} instance(s) are "
        f"down at once → +{max_surge} + {max_unavailable} = {n}"
    )
    return HeadroomItem("deployment", n, why)


def memory_headroom(
    peak_instances: int, p99_active_tokens_per_instance: float | None, kv_tokens_per_instance: float | None, safe_fraction: float
) -> HeadroomItem:
    if p99_active_tokens_per_instance is None or not kv_tokens_per_instance:
        return HeadroomItem("memory", 0, "no KV measurement at the operating point: not assessed")
    limit = safe_fraction * kv_tokens_per_instance
    p99 = p99_active_tokens_per_instance
    if p99 <= limit:
        why = f"P99 active KV tokens {p99:,.0f} ≤ {safe_fraction:g} × {kv_tokens_per_instance:,.0f} = {limit:,.0f} per instance → +0"
        return HeadroomItem("memory", 0, why)
    need = ceil_count(peak_instances * p99 / limit)
    why = (
        f"P99 active KV tokens {p99:,.0f} > {safe_fraction:g} × {kv_tokens_per_instance:,.0f} = {limit:,.0f} per "
        f"instance; ceil({peak_instances} × {p99:,.0f} / {limit:,.0f}) = {need} → +{need - peak_instances}"
    )
    return HeadroomItem("memory", need - peak_instances, why)


def control_headroom(t_ready_s: float, growth_rps: float, per_instance_rps: float, source: str) -> HeadroomItem:
    n = ceil_count(growth_rps / per_instance_rps)
    why = (
        f"demand can rise {growth_rps:.4g} req/s within T_ready {t_ready_s:g} s ({source}) before a new instance "
        f"serves; ceil({growth_rps:.4g} / {per_instance_rps:.4g}) = {n}"
    )
    return HeadroomItem("control", n, why)


@dataclass(frozen=True)
class CapacityPlan:
    rate_rps: float
    per_instance_rps: float
    gpus_per_instance: int
    base_instances: int
    items: tuple[HeadroomItem, ...]
    usd_per_gpu_hour: float

    @property
    def total_instances(self) -> int:
        return self.base_instances + sum(i.instances for i in self.items)

    @property
    def total_gpus(self) -> int:
        return self.total_instances * self.gpus_per_instance

    @property
    def usd_per_hour(self) -> float:
        return self.total_gpus * self.usd_per_gpu_hour

    @property
    def gpu_hours_per_day(self) -> float:
        return self.total_gpus * 24.0

    @property
    def operational_margin(self) -> float:
        """Headroom instances as a share of the base (0.5 = 50% more than the bare minimum)."""
        return (self.total_instances - self.base_instances) / self.base_instances if self.base_instances else 0.0

    def item(self, risk: str) -> HeadroomItem:
        return next(i for i in self.items if i.risk == risk)


def plan_headroom(
    rate_rps: float,
    per_instance_rps: float,
    gpus_per_instance: int,
    gpus_per_node: int,
    usd_per_gpu_hour: float,
    params: HeadroomParams | None = None,
    arrival_s: ArrayLike | None = None,
    p99_active_tokens_per_instance: float | None = None,
    kv_tokens_per_instance: float | None = None,
) -> CapacityPlan:
    """Base instances for `rate_rps` plus each risk's computed headroom (module docstring).

    `arrival_s`: the trace's arrivals as replayed at the planning rate (rate-scaled), so the demand ramp
    is in the planned traffic's units (peak-to-mean does not depend on the scale).
    """
    p = params or HeadroomParams()
    if per_instance_rps <= 0:
        raise LlmcapError("per-instance capacity must be > 0 req/s to plan headroom")
    base = ceil_count(rate_rps / per_instance_rps)
    if p.traffic_method == "peak_to_mean":
        if arrival_s is None:
            raise LlmcapError("traffic headroom 'peak_to_mean' needs the trace's arrival times")
        traffic = traffic_headroom(rate_rps, per_instance_rps, peak_to_mean(arrival_s, p.traffic_window_s), f"windowed peak/mean over {p.traffic_window_s:g} s")
    elif p.traffic_method == "forecast_error":
        traffic = traffic_headroom(rate_rps, per_instance_rps, 1 + p.forecast_error, f"forecast error +{p.forecast_error:.0%}")
    else:
        traffic = HeadroomItem("traffic", 0, "planning rate is already the peak")
    peak = base + traffic.instances
    if p.ramp_rps_per_s is not None:
        growth, src = p.ramp_rps_per_s * p.t_ready_s, f"given ramp {p.ramp_rps_per_s:g} req/s²"
    elif arrival_s is not None:
        growth, src = demand_growth(arrival_s, p.traffic_window_s, p.t_ready_s), f"largest rise of the {p.traffic_window_s:g} s-window rate in the trace"
    else:
        raise LlmcapError("control headroom needs ramp_rps_per_s or the trace's arrival times")
    items = (
        traffic,
        failure_headroom(peak, gpus_per_instance, gpus_per_node, p.node_failures),
        deployment_headroom(p.max_surge, p.max_unavailable),
        memory_headroom(peak, p99_active_tokens_per_instance, kv_tokens_per_instance, p.kv_safe_fraction),
        control_headroom(p.t_ready_s, growth, per_instance_rps, src),
    )
    return CapacityPlan(rate_rps, per_instance_rps, gpus_per_instance, base, items, usd_per_gpu_hour)
