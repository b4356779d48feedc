"""Headroom's remaining rules by hand (llmcap.sizing.headroom): a pool spread over nodes only when a node loss
is planned for, the count that a node loss forces, a re-placed pool, a rate below one instance, the KV
limit's edge and its words, what the reasoning says in req/s when G is not 1, and the plan's own fields."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.sizing.headroom import PoolInput, plan_headroom, plan_pool, traffic_plan
from llmcap.sizing.params import HeadroomParams

NO_OUTAGES = HeadroomParams(node_failures=0, max_surge=0, max_unavailable=0)
ONE_NODE = HeadroomParams(node_failures=1, max_surge=0, max_unavailable=0)


def _pool(rate: float, g: float, params: HeadroomParams, **kv):
    return plan_pool(traffic_plan(rate, params), PoolInput("decode", g, 2, 8, 1.0, **kv), params, 0.0, "none")


def items(plan) -> dict[str, tuple[float, int]]:
    return {i.risk: (i.rps, i.instances) for i in plan.items}


def test_with_no_node_loss_planned_a_pool_is_packed_onto_full_nodes() -> None:
    # 3 two-GPU instances, 4 fit an 8-GPU node: all on one node
    plan = _pool(3.0, 1.0, NO_OUTAGES)
    assert plan.instances == 3 and plan.placement.per_node == (3,)
    assert plan.with_instances(5).placement.per_node == (4, 1)  # re-placed the same way: 4 + 1


def test_with_a_node_loss_planned_a_small_pool_is_split_over_two_nodes() -> None:
    # S = 2. N = 2 sits 1 + 1 and a loss leaves 1; N = 3 sits 2 + 1 (at most ceil(3 / 2) = 2 a node), leaves 1;
    # N = 4 sits 2 + 2, leaves 2 = S. Packed (4 on one node) it would take N = 6 (4 + 2, leaves 2).
    plan = _pool(2.0, 1.0, ONE_NODE)
    assert (plan.survivors, plan.instances, plan.placement.per_node, plan.node_loss) == (2, 4, (2, 2), 2)
    assert plan.with_instances(5).placement.per_node == (3, 2) and plan.with_instances(5).node_loss == 3
    assert plan.with_instances(3).placement.per_node == (2, 1)
    assert items(plan)["failure"] == (2.0, 2)  # 2 instances lost × G 1; N − S = 2


def test_reasoning_in_req_s_multiplies_instances_by_g() -> None:
    # G = 2 req/s per instance, λ = 8: S = 4. One node lost, one surge instance: N = 5 sits 3 + 2 (loses 3, leaves 2),
    # 6 sits 3 + 3 (leaves 3), 7 sits 4 + 3 (leaves 3), 8 sits 4 + 4 (leaves 4 = S): N = 8
    params = HeadroomParams(node_failures=1, max_surge=1, max_unavailable=0)
    plan = _pool(8.0, 2.0, params)
    assert (plan.survivors, plan.instances, plan.node_loss, plan.upgrading) == (4, 8, 4, 1)
    assert items(plan)["failure"] == (8.0, 4) and items(plan)["deployment"] == (2.0, 0)
    assert plan.item("failure").reasoning == (
        "8 instance(s) of 2 GPUs on 2 8-GPU node(s) (8 // 2 = 4 max per node): 4+4; "
        "losing 1 node(s) loses 4 decode instance(s) = 8 req/s; the rest must carry 8 req/s"
    )
    assert plan.item("deployment").reasoning == (
        "rolling upgrade of the decode pool, one step at a time: 1 surge (GPUs for the new instance, not yet serving) "
        "+ 0 unavailable = 1 instance(s) = 2 req/s out; the rest must carry 8 req/s"
    )
    assert plan.combination() == (
        "survivors S = ceil(8 × memory / 2) = 4; N = 8 with max(node loss 4, upgrade 1) = 4 out "
        "leaves 4 ≥ S (capacity 16 req/s, 8 in the worst outage)"
    )
    assert (plan.target_rps, plan.planning_rps) == (8.0, 8.0)


def test_a_rate_below_one_instance_still_needs_one_and_no_headroom() -> None:
    # λ = 0.5 req/s, G = 1: ceil(0.5) = 1 instance, base 1; nothing to add for traffic or memory
    plan = _pool(0.5, 1.0, NO_OUTAGES)
    assert (plan.base_instances, plan.survivors, plan.instances) == (1, 1, 1)
    assert items(plan) == {
        "traffic": (0.0, 0),
        "memory": (0.0, 0),
        "failure": (0.0, 0),
        "deployment": (0.0, 0),
        "control": (0.0, 0),
    }


@pytest.mark.parametrize(
    "kv", [{"p99_kv_tokens": 50.0}, {"p99_kv_tokens": 50.0, "kv_tokens": 0.0}, {"kv_tokens": 100.0}]
)
def test_kv_is_assessed_only_with_both_a_reading_and_a_capacity(kv: dict) -> None:
    plan = _pool(4.0, 1.0, NO_OUTAGES, **kv)
    assert plan.survivors == 4 and items(plan)["memory"] == (0.0, 0)
    assert plan.item("memory").reasoning.endswith("not assessed")


def test_kv_exactly_at_its_limit_is_within_it_and_above_it_is_carried_by_more_instances() -> None:
    at = _pool(4.0, 1.0, NO_OUTAGES, p99_kv_tokens=90.0, kv_tokens=100.0)  # 90 = 0.9 × 100
    assert at.item("memory").reasoning == "P99 KV tokens 90 ≤ 0.9 × 100 = 90 per instance at its max rate"
    over = _pool(4.0, 1.0, NO_OUTAGES, p99_kv_tokens=99.0, kv_tokens=100.0)  # m = 99 / 90 = 1.1: S = ceil(4.4) = 5
    assert over.survivors == 5 and items(over)["memory"] == (pytest.approx(0.4), 1)
    assert over.item("memory").reasoning == (
        "P99 KV tokens 99 > 0.9 × 100 = 90 per instance at its max rate: the pool carries λ × 99 / 90 = λ × 1.1"
    )


def test_the_plan_carries_its_rates_the_traffic_reasoning_and_the_autoscalers_ramp() -> None:
    params = HeadroomParams(node_failures=0, max_surge=0, ramp_rps_per_s=0.01, t_ready_s=600.0)
    plan = plan_headroom(4.0, [PoolInput("instances", 1.0, 1, 8, 1.0)], params)
    assert (plan.target_rps, plan.planning_rps, plan.traffic_reasoning) == (4.0, 4.0, "target 4 req/s")
    # 0.01 req/s² over 600 s: 6 req/s to be ready ahead
    assert plan.pools[0].item("control").reasoning == (
        "static plan sized to the planning rate: 0 (an autoscaler would need 6 req/s ready ahead — given ramp 0.01 req/s² "
        "within T_ready 600 s)"
    )
    bare = plan_headroom(4.0, [PoolInput("instances", 1.0, 1, 8, 1.0)], NO_OUTAGES)
    assert (
        "would need 0 req/s ready ahead — no ramp given and no arrivals within"
        in bare.pools[0].item("control").reasoning
    )


def test_the_trace_arrivals_give_the_windowed_rates_the_replay_carries() -> None:
    # 60 s windows: 30 arrivals in the first, 90 in the second (the arrival at 120 s opens a partial third, dropped).
    # Scaled to mean λ = 4: 2 and 6 req/s; p99 = 2 + 0.99 × (6 − 2) = 5.96, max 6
    arrivals = np.concatenate([np.linspace(0.0, 59.0, 30), np.linspace(60.0, 119.0, 90), [120.0]])
    want = (
        "target 4 req/s; the whole-trace replay at that mean carries the trace's own bursts: 60 s windowed rate "
        "p99 5.96 req/s, max 6 req/s — no peak factor on top"
    )
    assert traffic_plan(4.0, NO_OUTAGES, arrivals).reasoning == want
    plan = plan_headroom(4.0, [PoolInput("instances", 1.0, 1, 8, 1.0)], NO_OUTAGES, arrival_s=arrivals)
    assert plan.traffic_reasoning == want
    assert "the trace's largest 60 s-window rise within T_ready" in plan.pools[0].item("control").reasoning
