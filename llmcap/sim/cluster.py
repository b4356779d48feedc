"""A trace through the cluster: every arrival submitted to the event loop (`llmcap.sim.loop`), in order,
then the loop run to its end; the replicas' logs closed at the end time."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llmcap.sim.autoscaler import ScaledPool
from llmcap.sim.config import SimConfig
from llmcap.sim.engine import Replica
from llmcap.sim.loop import ClusterLoop
from llmcap.sim.pd import Link
from llmcap.sim.recorder import Recorder
from llmcap.sim.steptime import StepTimer
from llmcap.sim.workload import Workload

PROGRESS_EVERY = 4096
EXACT_ITL_MAX_REQUESTS = 200_000  # itl_exact=None: exact (value, weight) pairs up to this many requests


@dataclass
class ClusterRun:
    recorder: Recorder
    replicas: list[Replica]  # prefill pool first (P/D), then decode pool
    roles: list[str]
    links: list[Link]
    end_s: float
    scaled: tuple[ScaledPool, ...] = ()  # the autoscaled pools (their replicas are in `replicas`)


def run_cluster(
    work: Workload,
    timer: StepTimer,
    cfg: SimConfig,
    rng: np.random.Generator | None,
    progress: Callable[[int, int], None] | None = None,
    decode_timer: StepTimer | None = None,
    on_decision: Callable[[Replica, float], None] | None = None,
) -> ClusterRun:
    """Every request of `work` submitted at its arrival, then the loop run to its end.
    `on_decision(replica, t)` runs after every replica decision (tests check invariants there)."""
    n = work.n
    rec = Recorder(n)
    ecfg = cfg.engine
    exact = cfg.itl_exact if cfg.itl_exact is not None else n <= EXACT_ITL_MAX_REQUESTS
    # per-request inputs as compact arrays of plain numbers (8 B each; lists of Python objects cost ~5x)
    isl, osl = array("q", work.isl.tobytes()), array("q", work.osl.tobytes())
    # singleton suffixes only where an engine keeps them as runs (Replica.lazy)
    segments = work.segment_index(
        isl, singletons=ecfg.enable_prefix_caching and not ecfg.offload_tiers() and not cfg.reference
    )
    cap = None if work.cap is None else array("q", work.cap.tobytes())
    adapter = None if work.adapter is None else array("q", work.adapter.tobytes())
    priority = None if work.priority is None else array("q", work.priority.tobytes())
    loop = ClusterLoop(
        cfg,
        timer,
        rec,
        rng,
        n,
        isl,
        osl,
        decode_timer=decode_timer,
        segments=segments,
        itl_exact=exact,
        on_decision=on_decision,
        cap=cap,
        adapter=adapter,
        priority=priority,
    )
    arrival = array("d", work.arrival.tobytes())
    for i in range(n):
        t = arrival[i]
        if not loop.run_until(t, inclusive=False) or t > loop.max_t:
            loop.stopped = True
            break
        if progress is not None and (i + 1) % PROGRESS_EVERY == 0:
            progress(i + 1, n)
        loop.submit(i, t)
    end = loop.run_to_end()
    replicas = loop.replicas()
    for r in replicas:
        r.sample_until(end)
        r.flush_log()
    if progress is not None:
        progress(n, n)
    return ClusterRun(rec, replicas, [r.role for r in replicas], loop.links, end, tuple(loop.scaled))
