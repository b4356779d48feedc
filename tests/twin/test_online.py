"""The online event loop is the simulator: fed a trace's arrivals one by one, it gives every request
the token times `simulate()` gives it (first token, finish, every gap), across routers, P/D, prefix
caching with a host tier and preemptions (the random configs of tests/sim)."""

from __future__ import annotations

from array import array

import numpy as np
import pytest

from llmcap.sim import simulate, workload_from_table
from llmcap.sim.steptime import StepTimer
from llmcap.twin.online import Flight, OnlineCluster
from tests.sim._workloads import MODEL, random_config, random_trace


def run_online(trace, cfg, seed: int, slots: int) -> list[Flight]:
    work = workload_from_table(trace, cfg.engine.block_size, cfg.engine.enable_prefix_caching)
    segments = work.segment_index(array("q", work.isl.tobytes()))
    emitted: list[tuple[Flight, int, float, bool]] = []
    cluster = OnlineCluster(StepTimer(MODEL), cfg, np.random.default_rng(seed), lambda *e: emitted.append(e), slots=slots,
                            keep_times=True)  # fmt: skip
    flights = []
    for i in range(work.n):
        keys, his = segments.of(i) if segments is not None else ([], [])
        flight = Flight(int(work.isl[i]), int(work.osl[i]), keys, his)
        t = float(work.arrival[i])
        cluster.run_until(t, inclusive=False)
        if cluster.fits(flight.isl, flight.osl):
            cluster.submit(flight, t)
        flights.append(flight)
    cluster.run_until(float("inf"))
    assert cluster.next_time() == float("inf") and cluster.in_flight == 0
    assert sum(n for _, n, _, _ in emitted) == sum(f.osl for f in flights if f.slot >= 0)
    return flights


@pytest.mark.parametrize("seed", range(12))
def test_online_cluster_gives_the_simulators_token_times(seed):
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, 120)
    cfg = random_config(rng, seed)
    sim = simulate(trace, MODEL, cfg, np.random.default_rng(seed))
    rec = sim.records.to_pandas()
    flights = run_online(trace, cfg, seed, slots=100 if seed % 2 else 512)  # fewer slots than requests: rows are reused
    served = np.array([f.slot >= 0 for f in flights])
    assert (served == (rec.status != "rejected").to_numpy()).all() and (rec.status[served] == "ok").all()  # every accepted request finishes
    first = np.array([f.times[0] if f.times else np.nan for f in flights])
    finish = np.array([f.times[-1] if f.times else np.nan for f in flights])
    np.testing.assert_array_equal(first[served], rec.first_token_s.to_numpy()[served])
    np.testing.assert_array_equal(finish[served], rec.finish_s.to_numpy()[served])
    assert all(len(f.times) == f.osl for f in flights if f.slot >= 0)
    gaps = np.sort(np.concatenate([np.diff(f.times) for f in flights if f.times]))
    np.testing.assert_allclose(gaps, np.sort(np.repeat(sim.itl_values, sim.itl_weights)), rtol=0, atol=1e-12)
    if seed == 0:  # the random configs do reach the interesting paths
        assert rec.preemptions.sum() > 0 or cfg.pd is not None
