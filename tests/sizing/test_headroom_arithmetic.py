"""Headroom by risk worked out by hand for two pools (llmcap.sizing.headroom.plan_pool), every item's req/s and
instances, so a change to any term of the rule shows."""

from __future__ import annotations

import pytest

from llmcap.errors import LlmcapError
from llmcap.sizing.headroom import PoolInput, plan_pool, traffic_plan
from llmcap.sizing.params import HeadroomParams


def items(plan) -> dict[str, tuple[float, int]]:
    return {i.risk: (i.rps, i.instances) for i in plan.items}


def test_a_pool_with_a_memory_limit_and_a_node_loss() -> None:
    # target 10 req/s, forecast error 20%: λ = 12. G = 1 req/s per instance of 2 GPUs, 4 per 8-GPU node.
    # P99 KV 95 of 100 tokens, safe 0.9: limit 90, memory factor m = 95/90; survivors S = ceil(12 × 95/90) = ceil(12.67) = 13.
    # One node lost takes 4 instances, one upgrade step 1: N = 17 (4+4+4+4+1; 17 − 4 = 13 ≥ S; 16 = 4×4 leaves 12).
    params = HeadroomParams(
        traffic_method="forecast_error", forecast_error=0.2, node_failures=1, max_surge=1, max_unavailable=0
    )
    traffic = traffic_plan(10.0, params)
    assert (traffic.target_rps, traffic.planning_rps) == (10.0, pytest.approx(12.0))
    plan = plan_pool(
        traffic, PoolInput("instances", 1.0, 2, 8, 3.0, p99_kv_tokens=95.0, kv_tokens=100.0), params, 0.5, "a ramp"
    )
    assert (plan.base_instances, plan.survivors, plan.instances, plan.gpus) == (10, 13, 17, 34)
    assert plan.node_loss == 4 and plan.upgrading == 1 and plan.usd_per_hour == pytest.approx(34 * 3.0)
    assert items(plan) == {
        "traffic": (pytest.approx(2.0), 2),  # λ − target; ceil(12) − ceil(10)
        "memory": (pytest.approx(12 * (95 / 90 - 1)), 1),  # λ (m − 1); S − ceil(λ / G) = 13 − 12
        "failure": (pytest.approx(4.0), 4),  # 4 instances lost × G; N − S, the larger outage
        "deployment": (
            pytest.approx(1.0),
            0,
        ),  # 1 instance out × G; smaller than the node loss: no instances of its own
        "control": (0.0, 0),
    }
    assert "P99 KV tokens 95 > 0.9 × 100 = 90" in plan.item("memory").reasoning
    assert plan.combination().startswith(
        "survivors S = ceil(12 × memory / 1) = 13; N = 17 with max(node loss 4, upgrade 1) = 4 out leaves 13 ≥ S"
    )
    assert plan.with_instances(16).placement.lost(1) == 4 and plan.with_instances(16).instances == 16


def test_an_upgrade_larger_than_any_node_loss() -> None:
    # no node failure planned, an upgrade step of 2 surge + 1 down = 3 out: N = S + 3 = 13 at λ = 10 (no KV reading: m = 1)
    params = HeadroomParams(node_failures=0, max_surge=2, max_unavailable=1)
    plan = plan_pool(traffic_plan(10.0, params), PoolInput("decode", 1.0, 1, 8, 2.0), params, 0.0, "none")
    assert (plan.base_instances, plan.survivors, plan.instances) == (10, 10, 13)
    assert items(plan) == {
        "traffic": (0.0, 0),
        "memory": (0.0, 0),
        "failure": (0.0, 0),
        "deployment": (3.0, 3),
        "control": (0.0, 0),
    }
    assert "not assessed" in plan.item("memory").reasoning


def test_kv_at_its_safe_limit_needs_no_memory_headroom() -> None:
    params = HeadroomParams(node_failures=0, max_surge=0, max_unavailable=0)
    plan = plan_pool(
        traffic_plan(4.0, params),
        PoolInput("instances", 1.0, 1, 8, 1.0, p99_kv_tokens=90.0, kv_tokens=100.0),
        params,
        0.0,
        "",
    )
    assert plan.survivors == plan.instances == 4 and items(plan)["memory"] == (0.0, 0)  # 90 ≤ 0.9 × 100


def test_a_pool_that_carries_nothing_is_an_error() -> None:
    with pytest.raises(LlmcapError, match="pool prefill: per-instance capacity must be > 0"):
        plan_pool(traffic_plan(4.0, HeadroomParams()), PoolInput("prefill", 0.0, 1, 8, 1.0), HeadroomParams(), 0.0, "")
