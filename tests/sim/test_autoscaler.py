"""The autoscaler's rule (HPA-style reactive layer over a floor) and an autoscaled pool in the simulator."""

from __future__ import annotations

import numpy as np
import pytest
from _workloads import MODEL, table
from pydantic import ValidationError

from llmcap.sim import AutoscaleConfig, EngineConfig, SimConfig, simulate
from llmcap.sim.autoscaler import Autoscaler

ENGINE = EngineConfig(num_blocks=400, max_num_seqs=32, max_num_batched_tokens=512)


def scaler(**kw) -> Autoscaler:
    base = dict(
        min_replicas=1,
        max_replicas=50,
        t_ready_s=60.0,
        interval_s=15.0,
        metric_window_s=1.0,
        scale_down_window_s=0.0,
        waiting_per_replica=2.0,
        kv_usage=0.5,
        tolerance=0.1,
    )
    return Autoscaler(AutoscaleConfig(**{**base, **kw}))


def test_kv_usage_is_proportional_both_ways_outside_the_tolerance():
    a = scaler()
    assert a.decide(0.0, 4, 0, 0.0, 0.75) == 6  # ceil(4 × 0.75 / 0.5)
    b = scaler()
    assert b.decide(0.0, 4, 0, 0.0, 0.53) == 4  # ratio 1.06: within ±10%
    c = scaler()
    assert c.decide(0.0, 4, 0, 0.0, 0.2) == 2  # ceil(4 × 0.4)


def test_a_waiting_queue_scales_up_within_hpa_limits_then_waits_for_the_new_replicas():
    a = scaler(kv_usage=None)
    first = a.decide(0.0, 2, 0, 20.0, 0.0)
    assert first == 6  # wanted ceil(2 × 20 / 2) = 20; limited to max(2 × 2, 2 + 4)
    assert a.decide(15.0, 2, 4, 20.0, 0.0) == 6  # the queue has not drained, but the 4 new ones are not routable yet
    assert a.decide(61.0, 6, 0, 20.0, 0.0) == 12  # cooldown (= t_ready) over: up again
    b = scaler(kv_usage=None)
    assert b.decide(0.0, 3, 0, 0.0, 0.0) == 3  # an empty queue is no reason to scale down


def test_scale_down_waits_for_the_stabilization_window_and_floor_holds():
    a = scaler(scale_down_window_s=100.0)
    assert a.decide(0.0, 4, 0, 0.0, 0.5) == 4
    assert a.decide(15.0, 4, 0, 0.0, 0.1) == 4  # the window still remembers 4
    assert a.decide(120.0, 4, 0, 0.0, 0.1) == 1
    f = scaler(floor_times_s=(0.0, 100.0), floor_replicas=(5, 2))
    assert f.decide(0.0, 5, 0, 0.0, 0.1) == 5
    assert f.decide(100.0, 5, 0, 0.0, 0.1) == 2
    assert f.initial() == 5


def test_config_rejects_inconsistent_settings():
    with pytest.raises(ValidationError, match="same length"):
        AutoscaleConfig(floor_times_s=(0.0,), floor_replicas=())
    with pytest.raises(ValidationError, match="increase"):
        AutoscaleConfig(floor_times_s=(5.0, 5.0), floor_replicas=(1, 2))
    with pytest.raises(ValidationError, match="power_of_two"):
        SimConfig(engine=ENGINE, router="power_of_two", autoscale=AutoscaleConfig())
    with pytest.raises(ValidationError, match="set pd"):
        SimConfig(engine=ENGINE, decode_autoscale=AutoscaleConfig())


def step_trace(low_rps: float, high_rps: float, switch_s: float, end_s: float, seed: int = 0):
    """Poisson arrivals at `low_rps`, then `high_rps` from `switch_s`; every prompt starts with one shared block."""
    rng = np.random.default_rng(seed)
    t, arrivals = 0.0, []
    while t < end_s:
        t += rng.exponential(1.0 / (low_rps if t < switch_s else high_rps))
        arrivals.append(t)
    n = len(arrivals)
    isl = rng.integers(64, 256, n)
    hashes = [[1] + list(range(10 + 100 * i, 10 + 100 * i + int(-(-isl[i] // 32)) - 1)) for i in range(n)]
    return table({"arrival_s": arrivals, "isl": isl, "osl": rng.integers(10, 60, n), "hash_ids": hashes}, 32)


def test_an_autoscaled_pool_grows_after_t_ready_cold_and_accounts_for_every_request():
    trace = step_trace(3.0, 40.0, switch_s=120.0, end_s=600.0)
    cfg = AutoscaleConfig(
        min_replicas=1, max_replicas=12, initial_replicas=1, t_ready_s=45.0, interval_s=10.0, min_residency_s=60.0
    )
    result = simulate(trace, MODEL, SimConfig(engine=ENGINE, autoscale=cfg, timeseries_resolution_s=5.0))
    log = result.autoscale
    assert log is not None
    life = log.replicas.to_pandas()
    rec = result.records.to_pandas()
    assert (rec.status == "ok").all()  # nothing lost while the pool changed
    grown = life[life.asked_s > 0]
    assert len(grown) >= 2 and grown.asked_s.min() >= 120.0  # nothing asked before the load came
    routable = grown.dropna(subset=["ready_s"])
    np.testing.assert_allclose(routable.ready_s - routable.asked_s, 45.0)  # T_ready, to the event
    for row in routable.itertuples():
        served = rec[rec.prefill_replica == row.replica]
        assert (served.arrival_s >= row.ready_s).all()  # capacity counts only once routable
        if row.ready_s < rec.arrival_s.max() - 10.0:  # (one ready after the last arrivals may serve nothing)
            assert len(served) and served.sort_values("arrival_s").iloc[0].cached_tokens == 0  # a cold prefix cache
    # each replica is paid for from the ask to its release, start-up included
    assert log.replica_seconds() == pytest.approx(float((life.released_s - life.asked_s).sum()))
    assert set(life.pool) == {"both"}
    assert (life.held_s >= 0).all()
    ts = result.timeseries.to_pandas()
    for row in routable.itertuples():
        assert ts[ts.replica == row.replica].t_s.min() >= row.asked_s  # a replica's gauges start when it was asked for
    # the static one replica of the start would not have held it
    static = simulate(trace, MODEL, SimConfig(engine=ENGINE, replicas=1))
    late = lambda r: np.nanpercentile(r.records.column("ttft_s").to_numpy(zero_copy_only=False).astype(float), 99)  # noqa: E731
    assert late(result) < late(static)


def test_scale_down_drains_and_respects_min_residency():
    trace = step_trace(40.0, 2.0, switch_s=200.0, end_s=700.0, seed=1)
    cfg = AutoscaleConfig(
        min_replicas=1,
        max_replicas=12,
        initial_replicas=6,
        t_ready_s=30.0,
        interval_s=10.0,
        min_residency_s=300.0,
        scale_down_window_s=60.0,
    )
    result = simulate(trace, MODEL, SimConfig(engine=ENGINE, autoscale=cfg, timeseries_resolution_s=5.0))
    life = result.autoscale.replicas.to_pandas()
    rec = result.records.to_pandas()
    assert (rec.status == "ok").all()
    stopped = life.dropna(subset=["stopped_s"])
    assert len(stopped) >= 3
    assert (stopped.stopped_s - stopped.ready_s >= 300.0).all()  # min residency
    for row in stopped.itertuples():
        served = rec[rec.prefill_replica == row.replica]
        assert (served.arrival_s <= row.stopped_s).all()  # nothing new after it stopped taking requests
        assert row.released_s == pytest.approx(max(row.stopped_s, served.finish_s.max()))  # held until drained
    ticks = result.autoscale.ticks.to_pandas()
    assert ticks.t_s.max() <= rec.arrival_s.max() + cfg.interval_s  # no ticks once the arrivals are over


def test_both_pools_of_a_pd_deployment_scale_on_their_own():
    from llmcap.sim import LinkConfig, PDConfig

    trace = step_trace(3.0, 120.0, switch_s=120.0, end_s=400.0, seed=2)
    pd = PDConfig(
        prefill_replicas=1,
        decode_replicas=1,
        link=LinkConfig(bandwidth_bytes_s=1e9, latency_s=0.001),
        first_token_from="decode",
    )
    engine = ENGINE.model_copy(update={"kv_bytes_per_token": 1000.0})
    scaler = AutoscaleConfig(
        min_replicas=1, max_replicas=10, initial_replicas=1, t_ready_s=30.0, interval_s=10.0, min_residency_s=60.0
    )
    result = simulate(
        trace,
        MODEL,
        SimConfig(engine=engine, pd=pd, autoscale=scaler, decode_autoscale=scaler, timeseries_resolution_s=5.0),
    )
    rec = result.records.to_pandas()
    assert (rec.status == "ok").all()  # every request through both pools while they changed
    life = result.autoscale.replicas.to_pandas()
    assert set(life.pool) == {"prefill", "decode"}
    for role, column in (("prefill", "prefill_replica"), ("decode", "decode_replica")):
        mine = life[life.pool == role]
        assert len(mine) >= 2, role  # each pool grew
        for row in mine.dropna(subset=["ready_s"]).itertuples():
            served = rec[rec[column] == row.replica]
            # routed when it arrives (prefill), when its prefill is done and the handoff leaves (decode)
            when = served.arrival_s if role == "prefill" else served.admitted_s + served.prefill_s
            assert (when >= row.ready_s - 1e-9).all(), role
    assert result.autoscale.replica_seconds() == pytest.approx(
        result.autoscale.replica_seconds("prefill") + result.autoscale.replica_seconds("decode")
    )
    ticks = result.autoscale.ticks.to_pandas()
    assert (
        set(ticks.pool) == {"prefill", "decode"}
        and (ticks.groupby("pool").size() == ticks.groupby("pool").size().iloc[0]).all()
    )
