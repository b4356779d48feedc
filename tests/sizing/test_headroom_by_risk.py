"""Headroom by risk on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.errors import LlmcapError
from llmcap.sizing.headroom import (
    control_headroom,
    deployment_headroom,
    failure_headroom,
    memory_headroom,
    plan_headroom,
    traffic_headroom,
)
from llmcap.sizing.params import HeadroomParams


def test_traffic():
    # λ 10, G 3: base ceil(3.33) = 4; ×1.5 → 15 req/s → ceil(5) = 5 → +1
    t = traffic_headroom(10, 3, 1.5, "test")
    assert t.instances == 1 and "= 5 instances vs base 4" in t.reasoning


def test_failure_rebuilds_whole_instances_per_node():
    assert failure_headroom(5, gpus_per_instance=2, gpus_per_node=8, node_failures=1).instances == 4  # 8 // 2
    f3 = failure_headroom(5, gpus_per_instance=3, gpus_per_node=8, node_failures=1)
    assert f3.instances == 2 and "2 GPU(s) stranded" in f3.reasoning  # 8 // 3 = 2, 8 − 6 = 2 stranded
    assert failure_headroom(5, 2, 8, node_failures=2).instances == 8
    assert failure_headroom(5, 16, 8, 1).instances == 1  # an instance spans 2 nodes: one node kills one instance
    assert failure_headroom(5, 2, 8, 0).instances == 0


def test_deployment_memory_control():
    assert deployment_headroom(1, 1).instances == 2
    # limit 0.9 × 10000 = 9000 < P99 9500: ceil(5 × 9500 / 9000) = ceil(5.28) = 6 → +1
    assert memory_headroom(5, 9500, 10000, 0.9).instances == 1
    assert memory_headroom(5, 8000, 10000, 0.9).instances == 0
    assert memory_headroom(5, None, 10000, 0.9).instances == 0
    # 600 s × 0.01 req/s² = 6 req/s of growth; ceil(6 / 3) = 2
    assert control_headroom(600, 6.0, 3, "given").instances == 2  # 6 req/s of growth / 3 per instance


def test_plan_sums_every_risk_with_cost():
    p = HeadroomParams(traffic_method="forecast_error", forecast_error=0.5, ramp_rps_per_s=0.01, max_surge=1, max_unavailable=0)
    plan = plan_headroom(
        10, 3, gpus_per_instance=2, gpus_per_node=8, usd_per_gpu_hour=2.5, params=p,
        p99_active_tokens_per_instance=9500, kv_tokens_per_instance=10000,
    )
    # base 4; traffic +1 (peak 5); failure +4; deployment +1; memory +1 (vs peak 5); control +2 → 13
    assert plan.base_instances == 4
    assert [(i.risk, i.instances) for i in plan.items] == [
        ("traffic", 1), ("failure", 4), ("deployment", 1), ("memory", 1), ("control", 2)
    ]
    assert (plan.total_instances, plan.total_gpus) == (13, 26)
    assert plan.usd_per_hour == pytest.approx(26 * 2.5)
    assert plan.gpu_hours_per_day == pytest.approx(26 * 24)
    assert plan.operational_margin == pytest.approx(9 / 4)
    assert all(i.reasoning for i in plan.items)


def test_plan_from_trace_arrivals():
    # 60 s windows: counts [60, 120, 60] → peak/mean = 120 / 80 = 1.5; rises +1 req/s then −1 → ramp 1/60 req/s²
    arr = np.r_[np.linspace(0, 59, 60), np.linspace(60, 119.5, 120), np.linspace(120, 179, 60), [180.0]]
    plan = plan_headroom(10, 3, 2, 8, 1.0, HeadroomParams(t_ready_s=360), arrival_s=arr)
    assert plan.item("traffic").instances == 1  # as in the hand case: 10 × 1.5 / 3 = 5 vs 4
    # within T_ready (360 s = up to 6 windows, only 2 lags exist) the rate rises at most 1 → 2 req/s = +1 req/s
    # → ceil(1 / 3) = 1 (a one-window slope of 1/60 req/s² is not extrapolated over 360 s)
    assert plan.item("control").instances == 1
    assert "not assessed" in plan.item("memory").reasoning
    none = plan_headroom(10, 3, 2, 8, 1.0, HeadroomParams(traffic_method="none", ramp_rps_per_s=0.0))
    assert none.item("traffic").instances == 0 and none.item("control").instances == 0
    with pytest.raises(LlmcapError):
        plan_headroom(10, 3, 2, 8, 1.0, HeadroomParams())  # peak_to_mean needs arrivals
    with pytest.raises(LlmcapError):
        plan_headroom(10, 0, 2, 8, 1.0, HeadroomParams(traffic_method="none", ramp_rps_per_s=0.0))


def test_failure_headroom_of_a_deployment_smaller_than_a_node():
    # 1-GPU instances, 8 per node, but only 2 needed: they need not share a node, so a node loss costs at most 2
    item = failure_headroom(2, 1, 8, 1)
    assert item.instances == 2
    # 20 needed: some node holds a full 8 of them → +8
    assert failure_headroom(20, 1, 8, 1).instances == 8
