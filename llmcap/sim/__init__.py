"""Request-level serving simulator: replicas with a vLLM-v1-like scheduler, routers, P/D handoff.

Public API:
    simulate(trace, model, config, rng=None, progress=None) -> SimResult
    SimConfig, EngineConfig, PDConfig, LinkConfig              knobs (pydantic, frozen)
    SimResult.records        pyarrow table, exactly `REQUEST_SCHEMA` (llmcap.sim.records)
    SimResult.itl_values / itl_weights   the exact token-weighted ITL distribution
    SimResult.timeseries     per-replica gauges and counters at `timeseries_resolution_s`
    SimResult.summary        dict (requests, completed, duration_s, ttft/itl/tpot/e2e ms p50/p90/p99, ...)
    SimResult.autoscale      with `SimConfig.autoscale` / `decode_autoscale`: control ticks and each replica's life, per pool
    weighted_quantiles(values, weights, qs)
    analytic_step_model(...)  a catalog-derived LinearStepModel stand-in (llmcap.sim.standin)
    CORE                     "native" (the mypyc-compiled core, see llmcap._native) or "source"
"""

from __future__ import annotations

from llmcap import _native

CORE = _native.load("sim")  # first: the compiled core (if built from these sources) before any module of it

import gc
import io
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmcap.perf.model import StepTimeModel, prefill_time
from llmcap.policy_names import router_names
from llmcap.sim.cluster import run_cluster
from llmcap.sim.config import AutoscaleConfig, EngineConfig, LinkConfig, PDConfig, SimConfig, TierConfig
from llmcap.sim.engine import Replica
from llmcap.sim.metrics import (
    autoscale_tables,
    itl_distribution,
    records_table,
    summary,
    timeseries_table,
    weighted_quantiles,
)
from llmcap.sim.records import REQUEST_SCHEMA
from llmcap.sim.routers import register_router, unregister_router
from llmcap.sim.steptime import StepTimer
from llmcap.sim.workload import Workload, workload_from_table

log = logging.getLogger(__name__)

__all__ = [
    "CORE",
    "REQUEST_SCHEMA",
    "AutoscaleConfig",
    "AutoscaleLog",
    "EngineConfig",
    "LinkConfig",
    "PDConfig",
    "SimConfig",
    "SimResult",
    "TierConfig",
    "Workload",
    "register_router",
    "router_names",
    "unregister_router",
    "simulate",
    "weighted_quantiles",
    "workload_from_table",
]


@dataclass(frozen=True)
class AutoscaleLog:
    ticks: pa.Table  # per pool, one row per control evaluation: ready, starting, gauges seen, floor, reactive, target
    replicas: pa.Table  # per pool, one row per replica ever asked for: asked_s, ready_s, stopped_s, released_s, held_s

    def replica_seconds(self, pool: str | None = None) -> float:
        """Σ held_s of `pool`'s replicas (None: every pool): what they cost, start-up and drain included."""
        held = self.replicas.column("held_s").to_numpy()
        if pool is not None:
            held = held[self.replicas.column("pool").to_numpy(zero_copy_only=False) == pool]
        return float(np.sum(held))


@dataclass(frozen=True)
class SimResult:
    records: pa.Table
    itl_values: np.ndarray  # seconds
    itl_weights: np.ndarray  # tokens with that gap
    timeseries: pa.Table
    summary: dict
    autoscale: AutoscaleLog | None = None
    handoff_post_s: np.ndarray | None = None  # P/D, per records row: prefill done -> KV on the link (NaN: no handoff)

    def records_parquet(self) -> bytes:
        """The records as Parquet bytes (deterministic: same run -> same bytes)."""
        buf = io.BytesIO()
        pq.write_table(self.records, buf, compression="zstd")
        return buf.getvalue()


MAX_TIMESERIES_BINS = 100_000  # per replica over the arrival span: memory follows requests, not the clock


def bounded_resolution(config: SimConfig, arrival: np.ndarray) -> SimConfig:
    """`config` with its time-series resolution coarsened where the arrival span would need more than
    MAX_TIMESERIES_BINS bins (a sparse trace over months must not cost gigabytes of empty rows)."""
    span = float(arrival[-1] - arrival[0]) if arrival.size else 0.0
    if span / config.timeseries_resolution_s <= MAX_TIMESERIES_BINS:
        return config
    return config.model_copy(update={"timeseries_resolution_s": span / MAX_TIMESERIES_BINS})


def simulate(
    trace: pa.Table,
    model: StepTimeModel,
    config: SimConfig,
    rng: np.random.Generator | None = None,
    progress: Callable[[int, int], None] | None = None,
    decode_model: StepTimeModel | None = None,
    on_decision: Callable[[Replica, float], None] | None = None,
) -> SimResult:
    """Replay a canonical trace open-loop through the configured cluster. `rng` feeds the
    power-of-two router (the only random choice); the same inputs give byte-identical outputs.
    `decode_model` times the decode pool of a P/D deployment when its parallelism differs from the
    prefill pool's (default: `model` for both). `on_decision(replica, t)` runs after every replica
    decision (a hook for invariant checks)."""
    start = time.perf_counter()
    work = workload_from_table(trace, config.engine.block_size, config.engine.enable_prefix_caching)
    config = bounded_resolution(config, work.arrival)
    decode_timer = None if decode_model is None else StepTimer(decode_model)
    # The event loop allocates millions of short-lived tuples and makes no reference cycles: the
    # cyclic collector would only rescan live state (measured: a few % of the run).
    collecting = gc.isenabled()
    gc.disable()
    try:
        run = run_cluster(work, StepTimer(model), config, rng, progress, decode_timer, on_decision)
    finally:
        if collecting:
            gc.enable()
    ids = trace.column("request_id").to_numpy() if "request_id" in trace.column_names else np.arange(work.n)
    records = records_table(run, ids, work.arrival, work.isl, work.osl, config.pd is not None)
    itl = itl_distribution(run)
    series = timeseries_table(run)
    scaling = AutoscaleLog(*autoscale_tables(run)) if run.scaled else None
    wall = time.perf_counter() - start
    log.debug(
        "simulated %d requests on %s in %.3f s wall (%s core)",
        work.n,
        f"P/D {config.pd.prefill_replicas}:{config.pd.decode_replicas}"
        if config.pd is not None
        else f"{config.replicas} replica(s)",
        wall,
        CORE,
    )
    s = summary(records, itl, run, wall)
    if "prefix_tiers" in s:
        tier_gains(s["prefix_tiers"], model, config.engine.max_num_batched_tokens)
    post = run.recorder.post if config.pd is not None else None
    return SimResult(records, itl[0], itl[1], series, s, scaling, post)


def tier_gains(tiers: list[dict], model: StepTimeModel, chunk: int) -> None:
    """Each offload tier's net gain (the source's ledger: saved prefill − lookup − load), in place: the
    prefill its hits saved, at the step model's seconds per prompt token of a full `chunk` computed alone
    (the step's fixed cost spread over the chunk), less the seconds spent loading and looking up."""
    per_token = float(prefill_time(model, [chunk], 0.0, chunk)[0]) / chunk
    for t in tiers:
        t["saved_prefill_s"] = t["hit_tokens"] * per_token
        t["net_gain_s"] = t["saved_prefill_s"] - t["load_s"] - t["lookup_s"]
