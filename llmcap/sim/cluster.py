"""The event loop: arrivals, replica decisions and KV handoffs, in (time, priority, tie) order.

Priorities at equal times: arrivals (0), then handoff landings (1), then replica decisions (2), then
the autoscalers' ticks and replicas becoming ready (3), so a replica deciding at t sees everything
that arrived at t. Ties within a kind go by request index, handoff number and replica index (control
events: their order of creation) — never by push order, so runs of one or many steps order events
the same way. Replicas keep their own clocks; a decision entry is stale once the replica's version
moved on (an arrival cut its run short).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from heapq import heappop, heappush

import numpy as np

from llmcap.sim.autoscaler import Autoscaler, ScaledPool
from llmcap.sim.config import AutoscaleConfig, EngineConfig, SimConfig
from llmcap.sim.engine import INF, Replica, Req
from llmcap.sim.pd import Link
from llmcap.sim.recorder import REJECTED, Recorder
from llmcap.sim.routers import Router, handoff_router
from llmcap.sim.steptime import StepTimer
from llmcap.sim.workload import Workload

ARRIVAL, LANDING, DECISION, CONTROL = 0, 1, 2, 3
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


def _blocks(tokens: np.ndarray, bs: int) -> np.ndarray:
    return -(-tokens // bs)


def run_cluster(
    work: Workload,
    timer: StepTimer,
    cfg: SimConfig,
    rng: np.random.Generator | None,
    progress: Callable[[int, int], None] | None = None,
    decode_timer: StepTimer | None = None,
    on_decision: Callable[[Replica, float], None] | None = None,
) -> ClusterRun:
    """`on_decision(replica, t)` runs after every replica decision (tests check invariants there)."""
    n = work.n
    rec = Recorder(n)
    pd = cfg.pd
    ecfg = cfg.engine
    exact = cfg.itl_exact if cfg.itl_exact is not None else n <= EXACT_ITL_MAX_REQUESTS
    # per-request inputs as compact arrays of plain numbers (8 B each; lists of Python objects cost ~5x)
    isl, osl = array("q", work.isl.tobytes()), array("q", work.osl.tobytes())
    # singleton suffixes only where an engine keeps them as runs (Replica.lazy)
    segments = work.segment_index(isl, singletons=ecfg.enable_prefix_caching and ecfg.host_blocks == 0 and not cfg.reference)
    at_handoff = pd is not None and pd.first_token_from == "decode"

    gids = [0]  # every replica's place in the cluster (heap ties), in creation order
    links: list[Link] = []  # P/D: each prefill replica's outgoing link, by its index

    def replica(j: int, ec: EngineConfig, tm: StepTimer, role: str, t: float = 0.0) -> Replica:
        r = Replica(
            j, ec, tm, rec, role=role, reference=cfg.reference, max_run_steps=cfg.max_run_steps,
            resolution_s=cfg.timeseries_resolution_s, first_token_at_handoff=at_handoff, segments=segments, itl_exact=exact,
        )  # fmt: skip
        r.gid = gids[0]
        gids[0] += 1
        r.grid_i = int(-(-t // r.res))  # its time series starts at the first grid time from its birth
        if role == "prefill":
            assert pd is not None
            links.append(Link(pd.link))
        return r

    def pool(n_static: int, ec: EngineConfig, tm: StepTimer, role: str, scaler: AutoscaleConfig | None) -> tuple[list[Replica], ScaledPool | None]:
        """A pool of `n_static` replicas, or, autoscaled, its routable ones (a list the autoscaler changes in place)."""
        if scaler is None:
            return [replica(j, ec, tm, role) for j in range(n_static)], None
        scaled = ScaledPool(Autoscaler(scaler), lambda j, t: replica(j, ec, tm, role, t), role)
        scaled.start(scaled.scaler.initial())
        return scaled.active, scaled

    if pd is None:
        front, scaled_front = pool(cfg.replicas, ecfg, timer, "both", cfg.autoscale)
        back: list[Replica] = []
        scaled_back = None
        fits = _blocks(work.isl + work.osl - 1, ecfg.block_size) <= ecfg.num_blocks
    else:
        dcfg = pd.decode_engine or ecfg
        front, scaled_front = pool(pd.prefill_replicas, ecfg, timer, "prefill", cfg.autoscale)
        back, scaled_back = pool(pd.decode_replicas, dcfg, decode_timer or timer, "decode", cfg.decode_autoscale)
        fits = (_blocks(work.isl, ecfg.block_size) <= ecfg.num_blocks) & (
            _blocks(work.isl + work.osl - 1, dcfg.block_size) <= dcfg.num_blocks
        )
    for ec in [ecfg] if pd is None else [ecfg, pd.decode_engine or ecfg]:
        if ec.max_model_len is not None:  # vLLM checks prompt + max_tokens against max_model_len before queueing
            fits &= work.isl + work.osl <= ec.max_model_len
    scaled = [sp for sp in (scaled_front, scaled_back) if sp is not None]
    router = Router(cfg.router, front, n, rng, cfg.prefix_load_penalty)
    back_router = handoff_router(cfg.router, back, n) if pd is not None else None
    kv_bytes = ecfg.kv_bytes_per_token
    prefix_router = router.needs_prefix_keys
    fits_l = array("b", fits.astype(np.int8).tobytes())
    arr_l = array("d", work.arrival.tobytes())
    heap: list[tuple] = []
    handoffs = 0
    max_t = cfg.max_time_s
    now = 0.0

    controls = 0

    def control(t: float, obj: tuple[ScaledPool, Replica] | None) -> None:
        nonlocal controls
        controls += 1
        heappush(heap, (t, CONTROL, controls, 0, obj))

    if scaled:
        control(0.0, None)

    def push(r: Replica) -> None:
        if r.next_time < INF:
            heappush(heap, (r.next_time, DECISION, r.gid, r.version, r))

    def handoff(p: Replica, req: Req, t: float) -> None:
        nonlocal handoffs
        i = req.i
        if osl[i] == 1:  # nothing to decode: done at the prefill side, its one token goes out now
            rec.first_token[i] = t
            rec.finish[i] = t
            rec.status[i] = 0
            if p.release(req, t):
                push(p)
            return
        assert back_router is not None
        d = back[back_router.choose(req, t)]
        rec.decode_replica[i] = d.index
        d.inbound += osl[i] - 1
        land, secs = links[p.index].send(t, kv_bytes * isl[i])
        rec.transfer[i] = secs
        handoffs += 1
        heappush(heap, (land, LANDING, handoffs, 0, (p, d, req)))

    ai = 0
    stopped = False
    while True:
        ta = arr_l[ai] if ai < n else INF
        if heap and heap[0][0] < ta:
            t, kind, _, payload, obj = heappop(heap)
            if t > max_t:
                stopped = True
                break
            now = t
            if kind == CONTROL:
                if obj is None:  # a tick of every autoscaled pool; the next one while requests are still to come
                    for sp in scaled:
                        for r in sp.tick(t):
                            control(t + sp.scaler.cfg.t_ready_s, (sp, r))
                    router.resized()
                    if back_router is not None:
                        back_router.resized()
                    if ai < n:
                        control(t + scaled[0].scaler.cfg.interval_s, None)  # (the pools share one period: SimConfig)
                else:
                    sp, r = obj
                    if sp.ready(r, t):
                        router.resized()
                        if back_router is not None:
                            back_router.resized()
                continue
            if kind == DECISION:
                r = obj
                if payload != r.version:  # stale: the run was cut short
                    continue
                r.horizon = ta
                r.advance()
                if on_decision is not None:
                    on_decision(r, t)
                if r.outputs:
                    outs, r.outputs = r.outputs, []
                    for req in outs:
                        handoff(r, req, t)
                push(r)
            else:  # a handoff landed
                p, d, req = obj
                if p.release(req, t):
                    push(p)
                i = req.i
                dreq = Req(i, isl[i], osl[i], [], [])  # the decode side does no prefix caching
                dreq.generated, dreq.n_comp, dreq.xfer = 1, isl[i], True
                dreq.last_tok = float(rec.first_token[i])
                d.inbound -= osl[i] - 1
                if d.add(dreq, t):
                    push(d)
            continue
        if ai >= n:
            break
        if ta > max_t:
            stopped = True
            break
        now = ta
        i = ai
        ai += 1
        if progress is not None and ai % PROGRESS_EVERY == 0:
            progress(ai, n)
        if not fits_l[i]:
            rec.status[i] = REJECTED
            continue
        req = Req(i, isl[i], 1 if pd is not None else osl[i])
        if prefix_router and ecfg.enable_prefix_caching and segments is not None:
            req.keys, req.block_ends = segments.of(i)
        r = front[router.choose(req, ta)]
        rec.prefill_replica[i] = r.index
        if pd is None:
            rec.decode_replica[i] = r.index
        if r.add(req, ta):
            push(r)
    end = max_t if stopped else now
    replicas = (scaled_front.members if scaled_front else front) + (scaled_back.members if scaled_back else back)
    for r in replicas:
        r.sample_until(end)
        r.flush_log()
    if progress is not None:
        progress(n, n)
    return ClusterRun(rec, replicas, [r.role for r in replicas], links, end, tuple(scaled))
