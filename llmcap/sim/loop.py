"""The event loop: arrivals, replica decisions and KV handoffs, in (time, priority, tie) order.

One loop for both drivers: `run_cluster` submits a trace's arrivals in order and runs to the end; the
twin (`llmcap.twin.online`) submits requests as they come and runs until now. Either way a request is
submitted after `run_until(t, inclusive=False)`, so every event before its arrival has run.

Priorities at equal times: arrivals (0), then handoff landings (1), then replica decisions (2), then
the autoscalers' ticks and replicas becoming ready (3), so a replica deciding at t sees everything
that arrived at t. Ties within a kind go by request index, handoff number and replica index (control
events: their order of creation) — never by push order, so runs of one or many steps order events
the same way. Replicas keep their own clocks; a decision entry is stale once the replica's version
moved on (an arrival cut its run short).

Routers draw by arrival number (0, 1, ... over every request offered, those rejected included), not by
recorder row: the twin reuses its rows, and the draws must not depend on which row a request got.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from heapq import heappop, heappush

import numpy as np

from llmcap.sim.autoscaler import Autoscaler, ScaledPool, share_budget
from llmcap.sim.config import AutoscaleConfig, EngineConfig, SimConfig
from llmcap.sim.engine import INF, Replica, Req
from llmcap.sim.pd import Link
from llmcap.sim.recorder import OK, REJECTED, Recorder
from llmcap.sim.routers import Router, handoff_router
from llmcap.sim.segments import SegmentIndex
from llmcap.sim.steptime import StepTimer

ARRIVAL, LANDING, DECISION, CONTROL = 0, 1, 2, 3  # arrivals never wait on the heap: `submit` takes them at once


def blocks(tokens: int, bs: int) -> int:
    return -(-tokens // bs)


class ClusterLoop:
    """The deployment of `cfg` (one pool, or P/D pools with one link per prefill replica) and its events.

    `isl`/`osl` hold each recorder row's lengths (the caller fills a row before submitting it), `cap` its
    client's max_tokens (≥ osl; None: the output itself, as if the scheduler knew it), `adapter` its LoRA
    adapter id (-1: none; None: no request has one), `priority` its scheduling priority (None: all 0);
    `on_decision(replica, t)` runs after every replica decision and its handoffs, `on_landing(replica,
    req)` when a handoff's KV landed and `req` joined the decode replica."""

    def __init__(
        self,
        cfg: SimConfig,
        timer: StepTimer,
        rec: Recorder,
        rng: np.random.Generator | None,
        n_requests: int,
        isl: array[int],
        osl: array[int],
        *,
        decode_timer: StepTimer | None = None,
        segments: SegmentIndex | None = None,
        itl_exact: bool = True,
        on_decision: Callable[[Replica, float], None] | None = None,
        on_landing: Callable[[Replica, Req], None] | None = None,
        cap: array[int] | None = None,
        adapter: array[int] | None = None,
        priority: array[int] | None = None,
    ) -> None:
        self.cfg = cfg
        self.pd = pd = cfg.pd
        self.rec = rec
        self.isl, self.osl = isl, osl
        self.cap = cap if cap is not None else osl
        self.adapter = adapter  # each row's LoRA adapter id (-1: none); None: no adapters
        self.priority = priority  # each row's scheduling priority; None: all 0
        self.segments = segments
        self.itl_exact = itl_exact
        self.on_decision = on_decision
        self.on_landing = on_landing
        self.at_handoff = pd is not None and pd.first_token_from == "decode"
        self.gids = 0  # every replica's place in the cluster (heap ties), in creation order
        self.links: list[Link] = []  # P/D: each prefill replica's outgoing link, by its index
        ecfg = cfg.engine
        self.engines = [ecfg] if pd is None else [ecfg, pd.decode_engine or ecfg]
        # what `fits` reads, as plain ints (it runs once a request; the configs are pydantic models)
        lens = [ec.max_model_len for ec in self.engines if ec.max_model_len is not None]
        self.max_len = min(lens) if lens else -1
        self.front_bs, self.front_blocks = ecfg.block_size, ecfg.num_blocks
        self.back_bs, self.back_blocks = self.engines[-1].block_size, self.engines[-1].num_blocks
        self.scaled_front: ScaledPool | None = None
        self.scaled_back: ScaledPool | None = None
        if pd is None:
            self.front, self.scaled_front = self._pool(cfg.replicas, ecfg, timer, "both", cfg.autoscale)
            self.back: list[Replica] = []
        else:
            self.front, self.scaled_front = self._pool(pd.prefill_replicas, ecfg, timer, "prefill", cfg.autoscale)
            self.back, self.scaled_back = self._pool(
                pd.decode_replicas, self.engines[1], decode_timer or timer, "decode", cfg.decode_autoscale
            )
        self.scaled = [sp for sp in (self.scaled_front, self.scaled_back) if sp is not None]
        self.router = Router(cfg.router, self.front, n_requests, rng, cfg.prefix_load_penalty)
        self.back_router = handoff_router(cfg.router, self.back, n_requests) if pd is not None else None
        self.prefix_keys = self.router.needs_prefix_keys and ecfg.enable_prefix_caching and segments is not None
        self.kv_bytes = ecfg.kv_bytes_per_token
        self.heap: list[tuple] = []
        self.handoffs = 0
        self.controls = 0
        self.arrivals = 0  # requests offered so far, rejected ones included: what the routers draw by
        self.max_t = cfg.max_time_s
        self.now = 0.0
        self.stopped = False  # the clock limit was reached: nothing runs any more
        self.closed = False  # no request comes any more (the autoscalers stop ticking)
        if self.scaled:
            self._schedule(0.0, None)

    # ------------------------------------------------------------ the deployment

    def _replica(self, j: int, ec: EngineConfig, tm: StepTimer, role: str, t: float = 0.0) -> Replica:
        cfg = self.cfg
        r = Replica(
            j,
            ec,
            tm,
            self.rec,
            role=role,
            reference=cfg.reference,
            max_run_steps=cfg.max_run_steps,
            resolution_s=cfg.timeseries_resolution_s,
            first_token_at_handoff=self.at_handoff,
            segments=self.segments,
            itl_exact=self.itl_exact,
        )
        r.gid = self.gids
        self.gids += 1
        r.grid_i = int(-(-t // r.res))  # its time series starts at the first grid time from its birth
        if role == "prefill":
            assert self.pd is not None
            self.links.append(Link(self.pd.link))
        return r

    def _pool(
        self, n: int, ec: EngineConfig, tm: StepTimer, role: str, scaler: AutoscaleConfig | None
    ) -> tuple[list[Replica], ScaledPool | None]:
        """A pool of `n` replicas, or, autoscaled, its routable ones (a list the autoscaler changes in place)."""
        if scaler is None:
            return [self._replica(j, ec, tm, role) for j in range(n)], None
        scaled = ScaledPool(Autoscaler(scaler), lambda j, t: self._replica(j, ec, tm, role, t), role)
        scaled.start(scaled.scaler.initial())
        return scaled.active, scaled

    def replicas(self) -> list[Replica]:
        """Every replica ever made: prefill pool (or the only pool) first, then the decode pool."""
        front = self.scaled_front.members if self.scaled_front is not None else self.front
        return front + (self.scaled_back.members if self.scaled_back is not None else self.back)

    def fits(self, isl: int, osl: int, cap: int = 0) -> bool:
        """Whether the deployment can ever serve the request (vLLM checks prompt + max_tokens (`cap`, at least
        the output) against max_model_len before queueing; the KV of a whole life must fit each pool it passes)."""
        if self.max_len >= 0 and isl + max(osl, cap) > self.max_len:
            return False
        if self.pd is None:
            return blocks(isl + osl - 1, self.front_bs) <= self.front_blocks
        return (
            blocks(isl, self.front_bs) <= self.front_blocks and blocks(isl + osl - 1, self.back_bs) <= self.back_blocks
        )

    # ------------------------------------------------------------ inputs

    def submit(
        self, i: int, t: float, keys: list[int] | None = None, block_ends: list[int] | None = None
    ) -> Req | None:
        """Request row i arrives at t (after `run_until(t, inclusive=False)`): the request on its replica, or
        None: rejected, it never fits. `keys`/`block_ends`: its prefix segments (None: the segment index's,
        read when needed)."""
        self.now = t
        arrival = self.arrivals
        self.arrivals += 1
        isl, osl, cap = self.isl[i], self.osl[i], self.cap[i]
        rec = self.rec
        if not self.fits(isl, osl, cap):
            rec.status[i] = REJECTED
            return None
        pd = self.pd is not None
        req = Req(i, isl, 1 if pd else osl, keys, block_ends)
        if not pd:
            req.cap = cap
        if self.adapter is not None:
            req.adapter = self.adapter[i]
        if self.priority is not None:
            req.priority = self.priority[i]
        if keys is None and self.prefix_keys:
            assert self.segments is not None
            req.keys, req.block_ends = self.segments.of(i)
        r = self.front[self.router.choose(req, t, arrival)]
        rec.prefill_replica[i] = r.index
        if not pd:
            rec.decode_replica[i] = r.index
        if r.add(req, t):
            self._push(r)
        return req

    def reject(self) -> None:
        """A request that never fits was turned away before `submit`: it still takes its arrival number."""
        self.arrivals += 1

    # ------------------------------------------------------------ the loop

    def next_time(self) -> float:
        """Time of the next event (INF: nothing to do until a request comes)."""
        heap = self.heap
        while heap and heap[0][1] == DECISION and heap[0][3] != heap[0][4].version:
            heappop(heap)  # stale: the replica's plan changed since
        return heap[0][0] if heap else INF

    def run_until(self, t: float, inclusive: bool = True) -> bool:
        """Run every event before t (and at t when `inclusive`); False once the clock limit stopped the run."""
        heap = self.heap
        while heap and not self.stopped:
            top = heap[0][0]
            if top > t or (top == t and not inclusive):
                break
            if top > self.max_t:
                self.stopped = True
                break
            when, kind, _, payload, obj = heappop(heap)
            self.now = when
            if kind == DECISION:
                if payload == obj.version:  # else stale: the run was cut short
                    self._decide(obj, when, t)
            elif kind == LANDING:
                self._land(obj, when)
            else:
                self._control(when, obj)
        return not self.stopped

    def run_to_end(self) -> float:
        """No more requests: run every event left (up to the clock limit); the time the run ends."""
        self.closed = True
        self.run_until(INF)
        return self.max_t if self.stopped else self.now

    def _push(self, r: Replica) -> None:
        if r.next_time < INF:
            heappush(self.heap, (r.next_time, DECISION, r.gid, r.version, r))

    def _decide(self, r: Replica, t: float, horizon: float) -> None:
        r.horizon = horizon  # the next outside event the loop knows of: a hint for planning run lengths
        r.advance()
        if r.outputs:
            outs, r.outputs = r.outputs, []
            for req in outs:
                self._handoff(r, req, t)
        self._push(r)
        if self.on_decision is not None:
            self.on_decision(r, t)

    def _handoff(self, p: Replica, req: Req, t: float) -> None:
        """Prefill of `req` done on `p` at t: its KV goes to a decode replica chosen now."""
        i = req.i
        rec = self.rec
        osl = self.osl[i]
        if osl == 1:  # nothing to decode: done at the prefill side, its one token goes out now
            rec.first_token[i] = t
            rec.finish[i] = t
            rec.status[i] = OK
            if p.release(req, t):
                self._push(p)
            return
        assert self.back_router is not None
        d = self.back[self.back_router.choose(req, t, -1)]
        rec.decode_replica[i] = d.index
        d.inbound += osl - 1
        land, secs, post = self.links[p.index].send(t, self.kv_bytes * self.isl[i])
        rec.transfer[i] = secs
        rec.post[i] = post
        self.handoffs += 1
        heappush(self.heap, (land, LANDING, self.handoffs, 0, (p, d, req)))

    def _land(self, obj: tuple[Replica, Replica, Req], t: float) -> None:
        p, d, req = obj
        if p.release(req, t):
            self._push(p)
        i = req.i
        isl, osl = self.isl[i], self.osl[i]
        dreq = Req(i, isl, osl, [], [])  # the decode side does no prefix caching
        dreq.cap = self.cap[i]
        if self.adapter is not None:
            dreq.adapter = self.adapter[i]
        if self.priority is not None:
            dreq.priority = self.priority[i]
        dreq.generated, dreq.n_comp, dreq.xfer = 1, isl, True
        dreq.last_tok = float(self.rec.first_token[i])
        d.inbound -= osl - 1
        if self.on_landing is not None:
            self.on_landing(d, dreq)
        if d.add(dreq, t):
            self._push(d)

    def _control(self, t: float, obj: tuple[ScaledPool, Replica] | None) -> None:
        """A tick of every autoscaled pool (obj None; the next one while requests may still come), or a replica ready."""
        if obj is not None:
            sp, r = obj
            if sp.ready(r, t):
                self._resized()
            return
        wanted = [sp.want(t) for sp in self.scaled]
        if self.cfg.max_total_gpus is not None:
            gpus = [sp.scaler.cfg.gpus_per_replica for sp in self.scaled]
            wanted = share_budget([sp.held() for sp in self.scaled], wanted, gpus, self.cfg.max_total_gpus)
        for sp, target in zip(self.scaled, wanted):
            for r in sp.apply(t, target):
                self._schedule(t + sp.scaler.cfg.t_ready_s, (sp, r))
        self._resized()
        if not self.closed:
            self._schedule(t + self.scaled[0].scaler.cfg.interval_s, None)  # (the pools share one period: SimConfig)

    def _schedule(self, t: float, obj: tuple[ScaledPool, Replica] | None) -> None:
        self.controls += 1
        heappush(self.heap, (t, CONTROL, self.controls, 0, obj))

    def _resized(self) -> None:
        self.router.resized()
        if self.back_router is not None:
            self.back_router.resized()
