"""Headroom per pool, in req/s, rounded once, on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.errors import LlmcapError
from llmcap.sizing.headroom import PoolInput, plan_headroom, traffic_plan
from llmcap.sizing.params import HeadroomParams
from llmcap.sizing.placement import place

# the seed's worked example pools: prefill TP2 at 4 req/s, decode TP4 at 7 req/s, 8-GPU nodes
PREFILL = PoolInput("prefill", per_instance_rps=4.0, gpus_per_instance=2, gpus_per_node=8, usd_per_gpu_hour=2.0)
DECODE = PoolInput("decode", per_instance_rps=7.0, gpus_per_instance=4, gpus_per_node=8, usd_per_gpu_hour=3.0)
STATIC = dict(traffic_method="replay", ramp_rps_per_s=0.0)


def test_placement_packs_nodes_and_a_lost_node_takes_its_instances():
    # 8 GPUs / 2 = 4 TP2 instances per node: 10 instances pack 4 + 4 + 2
    p = place(10, 2, 8)
    assert p.per_node == (4, 4, 2) and p.lost(1) == 4 and p.lost(2) == 8
    # a pool smaller than two full nodes splits over two, so one loss never takes all of it
    assert place(2, 2, 8).per_node == (1, 1) and place(5, 2, 8).per_node == (3, 2)
    # an instance wider than a node spans ceil(16 / 8) = 2 nodes: a lost node kills one instance
    assert place(3, 16, 8).lost(1) == 1
    # instances never span nodes: 8 // 3 = 2 per node
    assert place(4, 3, 8).per_node == (2, 2)


def test_a_node_of_four_prefill_instances_loses_four_prefill_not_a_unit():
    # λ = 24: prefill S = ceil(24 / 4) = 6; packed, 10 instances sit 4 + 4 + 2 and losing a node leaves 6 ≥ 6
    plan = plan_headroom(24.0, [PREFILL, DECODE], HeadroomParams(max_surge=1, **STATIC))
    pre, dec = plan.pool("prefill"), plan.pool("decode")
    assert (pre.survivors, pre.instances, pre.node_loss) == (6, 10, 4)
    assert pre.item("failure").instances == 4 and pre.item("failure").rps == pytest.approx(16.0)
    assert pre.item("deployment").instances == 0  # one upgrade step (1) needs less than a node loss (4): not summed
    # the decode pool is sized on its own: S = ceil(24 / 7) = 4, a TP4 node holds 2 → 6 (2 + 2 + 2), loses 2
    assert (dec.survivors, dec.instances, dec.node_loss) == (4, 6, 2)
    assert plan.total_gpus == 10 * 2 + 6 * 4 and plan.usd_per_hour == pytest.approx(20 * 2.0 + 24 * 3.0)


def test_surge_of_one_adds_one_instance_of_each_pool():
    # no node losses: the worked example's λ = 12 → S_P = 3, S_D = 2, each + 1 surge instance
    plan = plan_headroom(12.0, [PREFILL, DECODE], HeadroomParams(node_failures=0, max_surge=1, **STATIC))
    assert plan.counts() == {"prefill": 4, "decode": 3}
    assert (
        plan.pool("prefill").item("deployment").instances == 1 and plan.pool("decode").item("deployment").instances == 1
    )
    assert plan.pool("prefill").item("deployment").rps == pytest.approx(4.0)  # one instance's rate, in req/s
    none = plan_headroom(12.0, [PREFILL, DECODE], HeadroomParams(node_failures=0, max_surge=0, **STATIC))
    assert none.counts() == {"prefill": 3, "decode": 2}
    assert none.base_gpus == 3 * 2 + 2 * 4 and none.operational_margin == 0.0


def test_node_loss_and_upgrade_are_not_summed():
    # decode, λ = 12: S = 2; a lost node takes 2 TP4 instances, an upgrade step takes 1 + 1 = 2: N = 2 + 2, not 2 + 4
    params = HeadroomParams(max_surge=1, max_unavailable=1, **STATIC)
    dec = plan_headroom(12.0, [DECODE], params).pool("decode")
    assert (dec.survivors, dec.node_loss, dec.upgrading, dec.instances) == (2, 2, 2, 4)
    assert dec.item("failure").instances + dec.item("deployment").instances == 2
    # one node of 2 instances lost OR one step of 2 out: the rest (2 × 7 = 14 req/s) carry 12 req/s
    assert (dec.instances - max(dec.node_loss, dec.upgrading)) * 7.0 >= 12.0
    assert "max(node loss 2, upgrade 2) = 2 out" in dec.combination()
    assert dec.item("control").instances == 0 and dec.item("control").rps == 0.0


def test_memory_scales_the_rate_a_pool_carries_once():
    # P99 9,500 KV tokens > 0.9 × 10,000: the pool carries 12 × 9500 / 9000 = 12.67 req/s → S = ceil(12.67 / 7) = 2
    # (no rounding before the ceiling: 12 / 7 → 2 alone, too)
    hot = PoolInput("decode", 7.0, 4, 8, 3.0, p99_kv_tokens=9_500, kv_tokens=10_000)
    p = HeadroomParams(node_failures=0, max_surge=0, **STATIC)
    assert plan_headroom(12.0, [hot], p).pool("decode").survivors == 2
    # at λ = 13.5: 13.5 / 7 = 1.93 → 2, but 13.5 × 9500 / 9000 / 7 = 2.04 → 3
    q = plan_headroom(13.5, [hot], p).pool("decode")
    assert q.survivors == 3 and q.item("memory").instances == 1
    assert q.item("memory").rps == pytest.approx(13.5 * (9500 / 9000 - 1))
    cool = PoolInput("decode", 7.0, 4, 8, 3.0, p99_kv_tokens=8_000, kv_tokens=10_000)
    assert plan_headroom(13.5, [cool], p).pool("decode").item("memory").instances == 0
    assert "not assessed" in plan_headroom(13.5, [PREFILL], p).pool("prefill").item("memory").reasoning


def test_traffic_is_the_replay_at_the_planning_rate_not_a_peak_factor():
    # 60 s windows with counts [60, 120, 60]: the replay at mean 10 req/s has windows at 7.5, 15, 7.5 req/s
    arr = np.r_[np.linspace(0, 59, 60), np.linspace(60, 119.5, 120), np.linspace(120, 179, 60), [180.0]]
    t = traffic_plan(10.0, HeadroomParams(traffic_percentile=100), arr)
    assert t.planning_rps == 10.0 and "max 15 req/s" in t.reasoning and "no peak factor" in t.reasoning
    plan = plan_headroom(10.0, [PREFILL], HeadroomParams(node_failures=0, max_surge=0, **STATIC), arr)
    assert plan.pool("prefill").instances == 3 and plan.pool("prefill").item("traffic").instances == 0  # ceil(10 / 4)
    # a forecast: plan for its error quantile, and the replay at that mean
    f = plan_headroom(
        10.0,
        [PREFILL],
        HeadroomParams(traffic_method="forecast_error", forecast_error=0.25, node_failures=0, max_surge=0),
        arr,
    )
    assert f.planning_rps == pytest.approx(12.5) and f.pool("prefill").instances == 4  # ceil(12.5 / 4)
    assert f.pool("prefill").item("traffic").instances == 1 and f.pool("prefill").base_instances == 3
    with pytest.raises(LlmcapError):
        plan_headroom(10.0, [PoolInput("prefill", 0.0, 2, 8, 1.0)], HeadroomParams(**STATIC))


def test_every_item_keeps_its_reasoning_and_the_total_adds_up():
    plan = plan_headroom(24.0, [PREFILL, DECODE], HeadroomParams(max_surge=1, **STATIC))
    for q in plan.pools:
        assert [i.risk for i in q.items] == ["traffic", "memory", "failure", "deployment", "control"]
        assert all(i.reasoning for i in q.items)
        assert q.base_instances + sum(i.instances for i in q.items) == q.instances
