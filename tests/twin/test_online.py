"""The online event loop is the simulator: fed a trace's arrivals one by one, it gives every request
the token times `simulate()` gives it (first token, finish, every gap), across routers, P/D, prefix
caching with a host tier and preemptions (the random configs of tests/sim), and across every router
x 1-4 replicas x aggregated and P/D."""

from __future__ import annotations

from array import array

import numpy as np
import pytest

from llmcap.sim import LinkConfig, PDConfig, simulate, workload_from_table
from llmcap.sim.steptime import StepTimer
from llmcap.twin.online import Flight, OnlineCluster
from tests.sim._workloads import MODEL, ROUTERS, random_config, random_trace


def run_online(trace, cfg, seed: int, slots: int) -> list[Flight]:
    """Feed the trace's requests one by one, as a twin gets them; the power-of-two pairs drawn as the
    simulator draws them for this trace (all n at once)."""
    work = workload_from_table(trace, cfg.engine.block_size, cfg.engine.enable_prefix_caching)
    segments = work.segment_index(array("q", work.isl.tobytes()))
    emitted: list[tuple[Flight, int, float, bool]] = []
    cluster = OnlineCluster(
        StepTimer(MODEL),
        cfg,
        np.random.default_rng(seed),
        lambda *e: emitted.append(e),
        slots=slots,
        keep_times=True,
        draws=work.n,
    )
    flights = []
    for i in range(work.n):
        keys, his = segments.of(i) if segments is not None else ([], [])
        flight = Flight(int(work.isl[i]), int(work.osl[i]), keys, his)
        t = float(work.arrival[i])
        cluster.run_until(t, inclusive=False)
        if cluster.fits(flight.isl, flight.osl):
            cluster.submit(flight, t)
        else:
            cluster.reject()  # it still takes its place in arrival order
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
    assert (served == (rec.status != "rejected").to_numpy()).all() and (
        rec.status[served] == "ok"
    ).all()  # every accepted request finishes
    first = np.array([f.times[0] if f.times else np.nan for f in flights])
    finish = np.array([f.times[-1] if f.times else np.nan for f in flights])
    np.testing.assert_array_equal(first[served], rec.first_token_s.to_numpy()[served])
    np.testing.assert_array_equal(finish[served], rec.finish_s.to_numpy()[served])
    assert all(len(f.times) == f.osl for f in flights if f.slot >= 0)
    gaps = np.sort(np.concatenate([np.diff(f.times) for f in flights if f.times]))
    np.testing.assert_allclose(gaps, np.sort(np.repeat(sim.itl_values, sim.itl_weights)), rtol=0, atol=1e-12)
    if seed == 0:  # the random configs do reach the interesting paths
        assert rec.preemptions.sum() > 0 or cfg.pd is not None


PD_LINK = LinkConfig(bandwidth_bytes_s=1e8, latency_s=0.001)
GRID = [(router, n, pd) for router in ROUTERS for n in (1, 2, 3, 4) for pd in (False, True)]


@pytest.mark.parametrize(("router", "replicas", "pd"), GRID)
def test_every_router_and_pool_size_routes_as_the_simulator(router: str, replicas: int, pd: bool):
    # one trace and engine per case (seeded by its place in the grid); P/D pools of n prefill and 5 - n decode replicas
    seed = 100 + GRID.index((router, replicas, pd))
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, 120)
    cfg = random_config(rng, seed)
    # max_model_len 300 turns away ~10%: isl in [1, 299], osl in [1, 59], so
    # P(isl + osl > 300) = sum(o - 1 for o in 1..59) / (299 * 59) = 1711 / 17641; rejected requests keep
    # their place in the routers' arrival order
    cfg = cfg.model_copy(
        update={
            "engine": cfg.engine.model_copy(update={"max_model_len": 300}),
            "router": router,
            "replicas": replicas,
            "pd": PDConfig(
                prefill_replicas=replicas,
                decode_replicas=5 - replicas,
                link=PD_LINK,
                first_token_from="decode" if seed % 2 else "prefill",
            )
            if pd
            else None,
        }
    )
    sim = simulate(trace, MODEL, cfg, np.random.default_rng(seed))
    rec = sim.records.to_pandas()
    flights = run_online(trace, cfg, seed, slots=100 if seed % 2 else 512)
    served = np.array([f.slot >= 0 for f in flights])
    assert (served == (rec.status != "rejected").to_numpy()).all() and 60 < served.sum() < len(
        flights
    )  # most fit, not all
    # the same replicas chose (prefill or only pool: the router under test; decode pool: the handoff router)
    assert [f.front for f in flights if f.slot >= 0] == rec.prefill_replica[served].tolist()
    if pd:
        assert [f.back for f in flights if f.slot >= 0 and f.osl > 1] == rec.decode_replica[
            served & (rec.osl > 1)
        ].tolist()
    first = np.array([f.times[0] if f.times else np.nan for f in flights])
    finish = np.array([f.times[-1] if f.times else np.nan for f in flights])
    np.testing.assert_array_equal(first[served], rec.first_token_s.to_numpy()[served])
    np.testing.assert_array_equal(finish[served], rec.finish_s.to_numpy()[served])
