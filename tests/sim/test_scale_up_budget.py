"""A scale-up's four points (target set, pod running, model ready, router admitted) and the shared GPU budget of
autoscaled pools (`llmcap.sim.autoscaler.share_budget`)."""

from __future__ import annotations

import numpy as np
import pytest
from _workloads import MODEL, table
from pydantic import ValidationError

from llmcap.sim import AutoscaleConfig, EngineConfig, LinkConfig, PDConfig, SimConfig, simulate
from llmcap.sim.autoscaler import share_budget

ENGINE = EngineConfig(num_blocks=400, max_num_seqs=32, max_num_batched_tokens=512, kv_bytes_per_token=1000.0)


def steady_trace(rate: float, end_s: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, int(rate * end_s * 1.2)))
    arrivals = arrivals[arrivals < end_s]
    n = arrivals.size
    return table({"arrival_s": arrivals, "isl": rng.integers(64, 256, n), "osl": rng.integers(10, 60, n)})


def test_a_scale_up_passes_its_four_points_in_order_at_the_phase_offsets():
    # the floor asks for a second replica from t = 20: the tick at t = 20 (interval 10) sets the target; phases of
    # schedule + image 15 s, + weights/init/graphs 25 s, + admission 5 s: running 35, model ready 60, admitted 65
    cfg = AutoscaleConfig(
        initial_replicas=1,
        interval_s=10.0,
        t_ready_s=45.0,
        pod_running_after_s=15.0,
        model_ready_after_s=40.0,
        floor_times_s=(0.0, 20.0),
        floor_replicas=(1, 2),
        waiting_per_replica=None,
        kv_usage=None,
        min_residency_s=1e6,
    )
    result = simulate(steady_trace(1.0, 120.0), MODEL, SimConfig(engine=ENGINE, autoscale=cfg))
    life = result.autoscale.replicas.to_pandas().sort_values("replica")
    assert len(life) == 2
    first, grown = life.iloc[0], life.iloc[1]
    assert (first.asked_s, first.running_s, first.model_ready_s, first.ready_s) == (
        0.0,
        0.0,
        0.0,
        0.0,
    )  # there at the start
    assert (grown.asked_s, grown.running_s, grown.model_ready_s, grown.ready_s) == (20.0, 35.0, 60.0, 65.0)
    rec = result.records.to_pandas()
    assert (rec[rec.prefill_replica == 1].arrival_s >= 65.0).all()  # no request routed before the router admitted it


def test_unknown_phases_are_not_made_up_and_points_must_be_ordered():
    cfg = AutoscaleConfig(
        initial_replicas=1,
        interval_s=10.0,
        t_ready_s=30.0,
        floor_times_s=(0.0, 10.0),
        floor_replicas=(1, 2),
        waiting_per_replica=None,
        kv_usage=None,
        min_residency_s=1e6,
    )
    life = simulate(
        steady_trace(1.0, 60.0), MODEL, SimConfig(engine=ENGINE, autoscale=cfg)
    ).autoscale.replicas.to_pandas()
    grown = life[life.asked_s > 0].iloc[0]
    assert np.isnan(grown.running_s) and np.isnan(grown.model_ready_s) and grown.ready_s == 40.0  # 10 + 30
    with pytest.raises(ValidationError, match="ordered"):
        AutoscaleConfig(t_ready_s=30.0, pod_running_after_s=20.0, model_ready_after_s=10.0)
    with pytest.raises(ValidationError, match="ordered"):
        AutoscaleConfig(t_ready_s=30.0, model_ready_after_s=31.0)


def test_share_budget_keeps_what_is_held_and_fills_the_larger_unmet_share_first():
    # held 2 + 2 at 2 and 4 GPUs = 12 of 20: 8 free. Unmet shares: prefill (6−2)/6 = .67 > decode (3−2)/3 = .33 → prefill 3;
    # .5 > .33 → prefill 4 (4 free); .33 = .33 → tie to decode: 3 (0 free). 4×2 + 3×4 = 20
    assert share_budget([2, 2], [6, 3], [2, 4], 20) == [4, 3]
    assert share_budget([2, 2], [6, 3], [2, 4], 100) == [6, 3]  # a budget that does not bind changes nothing
    assert share_budget([5, 2], [3, 4], [1, 4], 12) == [
        3,
        2,
    ]  # prefill shrinks to 3 (3 + 8 = 11): 1 GPU free, a decode takes 4
    assert share_budget([4, 4], [6, 6], [1, 1], 6) == [
        4,
        4,
    ]  # above the budget already: nothing new, nothing taken away


def test_pd_pools_under_a_gpu_budget_never_hold_more_than_it():
    rng = np.random.default_rng(3)
    arrivals = np.concatenate(
        [np.cumsum(rng.exponential(1 / 3.0, 300)), 100.0 + np.cumsum(rng.exponential(1 / 120.0, 30000))]
    )
    arrivals = np.sort(arrivals[arrivals < 250.0])
    n = arrivals.size
    trace = table({"arrival_s": arrivals, "isl": rng.integers(64, 256, n), "osl": rng.integers(10, 60, n)})
    pd = PDConfig(
        prefill_replicas=1,
        decode_replicas=1,
        link=LinkConfig(bandwidth_bytes_s=1e9, latency_s=0.001),
        first_token_from="decode",
    )
    prefill = AutoscaleConfig(
        min_replicas=1,
        max_replicas=10,
        initial_replicas=1,
        t_ready_s=30.0,
        interval_s=10.0,
        min_residency_s=60.0,
        gpus_per_replica=2,
    )
    decode = prefill.model_copy(update={"gpus_per_replica": 4})

    def held_gpus(budget):
        cfg = SimConfig(
            engine=ENGINE,
            pd=pd,
            autoscale=prefill,
            decode_autoscale=decode,
            timeseries_resolution_s=5.0,
            max_total_gpus=budget,
        )
        ticks = simulate(trace, MODEL, cfg).autoscale.ticks.to_pandas()
        ticks["gpus"] = (ticks.ready + ticks.starting) * ticks.pool.map({"prefill": 2, "decode": 4})
        return ticks.groupby("t_s").gpus.sum().max()

    free = held_gpus(None)
    assert free > 14  # unbounded, the step up takes more than the budget below
    assert held_gpus(14) <= 14
    with pytest.raises(ValidationError, match="budget of autoscaled pools"):
        SimConfig(engine=ENGINE, max_total_gpus=8)
