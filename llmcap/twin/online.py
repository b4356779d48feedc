"""The simulator's event loop run online: requests arrive one by one at times nobody knew in advance.

`llmcap.sim.cluster.run_cluster` replays a known trace; this is the same loop (replica decisions
and P/D handoff landings on a heap, the same routers, the same `Replica` engines) fed by `submit`
and advanced by `run_until`, with the same order at equal times: an arrival before the decisions
at its instant (`run_until(t, inclusive=False)`, then `submit(..., t)`).

Replicas run in reference mode (one engine step per decision; identical results to the fast mode,
tests/sim), so after each decision the requests on that replica have exactly the tokens they have
at the step's end, and `emit` hands them out at that instant. Generated so far = `generated` for a request
outside the decoding set, generated_at_join + (steps since it joined) inside it.

Recorder rows are slots reused FIFO (a twin serves forever; the recorder is a fixed array), and the
step log keeps a histogram (itl_exact=False) whose dead steps are dropped: memory stays bounded.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from heapq import heappop, heappush

import numpy as np

from llmcap.routing import includes_handoff
from llmcap.sim.config import EngineConfig, SimConfig
from llmcap.sim.engine import INF, Replica, Req
from llmcap.sim.pd import Link
from llmcap.sim.recorder import OK, UNFINISHED, Recorder
from llmcap.sim.routers import Router, handoff_router
from llmcap.sim.steptime import StepTimer

LANDING, DECISION = 1, 2
DEFAULT_SLOTS = 1 << 16  # requests in flight at once
SAMPLE_EVERY_S = 3600.0  # the replicas' time series is not read: one row an engine-hour


@dataclass(eq=False)
class Flight:
    """One request in the cluster, from `submit` to its last token."""

    isl: int
    osl: int
    keys: list[int]  # prefix-cache keys of its prompt's segments (`twin.prefix.block_keys`: one a full block)
    block_ends: list[int] | None = None  # engine-block end of each segment (None: one block per key)
    tag: object = None  # the caller's (the server's stream)
    slot: int = -1
    req: Req | None = None  # on its replica (the prefill replica under P/D)
    dreq: Req | None = None  # P/D: on its decode replica once the KV landed
    front: int = -1  # replica that prefills it (index in the prefill pool, or the only pool)
    back: int = -1  # P/D: decode replica
    sent: int = 0  # tokens handed to `emit` so far
    cached: int = 0  # prompt tokens its prefill found in the prefix cache (known at the first token)
    on: int = -1  # gid of the replica whose decisions produce its next tokens
    done: bool = False
    times: list[float] = field(default_factory=list)  # engine time of each token (kept only if asked)


# emit(flight, new tokens, engine time, finished)
Emit = Callable[[Flight, int, float, bool], None]


def _blocks(tokens: int, bs: int) -> int:
    return -(-tokens // bs)


class OnlineCluster:
    def __init__(
        self, timer: StepTimer, cfg: SimConfig, rng: np.random.Generator | None, emit: Emit, *,
        slots: int = DEFAULT_SLOTS, decode_timer: StepTimer | None = None, keep_times: bool = False,
    ) -> None:  # fmt: skip
        self.cfg = cfg
        self.pd = cfg.pd
        self.emit = emit
        self.keep_times = keep_times
        self.rec = rec = Recorder(slots)
        self.free_slots: deque[int] = deque(range(slots))
        at_handoff = self.pd is not None and includes_handoff(self.pd.first_token_from)

        def replica(j: int, ec: EngineConfig, tm: StepTimer, role: str) -> Replica:
            return Replica(j, ec, tm, rec, role=role, reference=True, resolution_s=SAMPLE_EVERY_S,
                           first_token_at_handoff=at_handoff, segments=None, itl_exact=False)

        ecfg = cfg.engine
        if self.pd is None:
            self.front = [replica(j, ecfg, timer, "both") for j in range(cfg.replicas)]
            self.back: list[Replica] = []
            self.engines = [ecfg]
        else:
            dcfg = self.pd.decode_engine or ecfg
            self.front = [replica(j, ecfg, timer, "prefill") for j in range(self.pd.prefill_replicas)]
            self.back = [replica(j, dcfg, decode_timer or timer, "decode") for j in range(self.pd.decode_replicas)]
            self.engines = [ecfg, dcfg]
        self.replicas = self.front + self.back
        for gid, r in enumerate(self.replicas):
            r.gid = gid
        self.router = Router(cfg.router, self.front, slots, rng, cfg.prefix_load_penalty)
        self.back_router = handoff_router(cfg.router, self.back, slots) if self.back else None
        self.links = [Link(self.pd.link) for _ in self.front] if self.pd is not None else []
        self.watch: list[dict[int, Flight]] = [{} for _ in self.replicas]  # slot -> flight, per replica gid
        self.heap: list[tuple] = []
        self.handoffs = 0
        self.now = 0.0

    # ------------------------------------------------------------ inputs

    def fits(self, isl: int, osl: int) -> bool:
        """Whether the deployment can ever serve it (the simulator rejects the rest on arrival)."""
        ok = True
        for ec in self.engines:
            if ec.max_model_len is not None and isl + osl > ec.max_model_len:
                ok = False
        ecfg = self.cfg.engine
        if self.pd is None:
            return ok and _blocks(isl + osl - 1, ecfg.block_size) <= ecfg.num_blocks
        dcfg = self.engines[-1]
        return ok and _blocks(isl, ecfg.block_size) <= ecfg.num_blocks and _blocks(isl + osl - 1, dcfg.block_size) <= dcfg.num_blocks

    @property
    def in_flight(self) -> int:
        return len(self.rec.status) - len(self.free_slots)

    def submit(self, flight: Flight, t: float) -> None:
        """A request arrives at engine time t (>= every decision already run). The caller checked
        `fits` and that a slot is free."""
        self.now = t
        i = flight.slot = self.free_slots.popleft()
        self._reset_slot(i)
        caching = self.cfg.engine.enable_prefix_caching
        keys = flight.keys if caching else []
        block_ends = (flight.block_ends if flight.block_ends is not None else list(range(1, len(keys) + 1))) if caching else []
        req = Req(i, flight.isl, 1 if self.pd is not None else flight.osl, keys, block_ends)
        j = self.router.choose(req, t)
        rec = self.rec
        rec.prefill_replica[i] = j
        if self.pd is None:
            rec.decode_replica[i] = j
        flight.req, flight.front = req, j
        r = self.front[j]
        self._watch(flight, r.gid)
        if r.add(req, t):
            self._push(r)

    def _reset_slot(self, i: int) -> None:
        rec = self.rec
        for col in (rec.admitted, rec.first_token, rec.prefill_done, rec.decode_admitted, rec.finish, rec.transfer,
                    rec.itl_p50, rec.itl_p99, rec.itl_max):  # fmt: skip
            col[i] = math.nan
        rec.cached[i] = rec.host_cached[i] = rec.preemptions[i] = 0
        rec.prefill_replica[i] = rec.decode_replica[i] = -1
        rec.status[i] = UNFINISHED

    # ------------------------------------------------------------ the loop

    def next_time(self) -> float:
        """Engine time of the next decision or landing (INF: nothing to do until a request comes)."""
        heap = self.heap
        while heap and heap[0][1] == DECISION and heap[0][3] != heap[0][4].version:
            heappop(heap)  # stale: the replica's plan changed since
        return heap[0][0] if heap else INF

    def run_until(self, t: float, inclusive: bool = True) -> None:
        """Run every event before t (and at t when `inclusive`)."""
        heap = self.heap
        while heap:
            top = heap[0][0]
            if top > t or (top == t and not inclusive):
                break
            when, kind, _, payload, obj = heappop(heap)
            self.now = when
            if kind == DECISION:
                if payload == obj.version:
                    self._decide(obj, when)
            else:
                self._land(obj, when)

    def _push(self, r: Replica) -> None:
        if r.next_time < INF:
            heappush(self.heap, (r.next_time, DECISION, r.gid, r.version, r))

    def _decide(self, r: Replica, t: float) -> None:
        r.horizon = INF
        r.advance()
        if r.outputs:
            outs, r.outputs = r.outputs, []
            for req in outs:
                self._handoff(r, req, t)
        self._push(r)
        self._check(r.gid, t)

    def _handoff(self, p: Replica, req: Req, t: float) -> None:
        i = req.i
        flight = self.watch[p.gid][i]
        rec = self.rec
        if flight.osl == 1:  # nothing to decode: done at the prefill side, its one token goes out now
            rec.first_token[i] = t
            rec.finish[i] = t
            rec.status[i] = OK
            if p.release(req, t):
                self._push(p)
            return
        assert self.back_router is not None
        d = self.back_router.choose(req, t)
        rec.decode_replica[i] = d
        self.back[d].inbound += flight.osl - 1
        land, secs = self.links[p.index].send(t, self.cfg.engine.kv_bytes_per_token * flight.isl)
        rec.transfer[i] = secs
        self.handoffs += 1
        flight.back = d
        heappush(self.heap, (land, LANDING, self.handoffs, 0, (p, req, flight)))

    def _land(self, obj: tuple[Replica, Req, Flight], t: float) -> None:
        p, req, flight = obj
        if p.release(req, t):
            self._push(p)
        i, d = req.i, flight.back
        dreq = Req(i, flight.isl, flight.osl, [], [])  # the decode side does no prefix caching
        dreq.generated, dreq.n_comp, dreq.xfer = 1, flight.isl, True
        dreq.last_tok = float(self.rec.first_token[i])
        dr = self.back[d]
        dr.inbound -= flight.osl - 1
        flight.dreq = dreq
        self._watch(flight, dr.gid)
        if dr.add(dreq, t):
            self._push(dr)

    def _watch(self, flight: Flight, gid: int) -> None:
        if flight.on >= 0:
            del self.watch[flight.on][flight.slot]
        self.watch[gid][flight.slot] = flight
        flight.on = gid

    # ------------------------------------------------------------ tokens out

    def _generated(self, req: Req, r: Replica) -> int:
        return req.generated_at_join + (r.step_clock - req.joined_at_step) if req.decoding else req.generated

    def tokens(self, flight: Flight) -> int:
        """Tokens the request has produced so far (as its client sees them)."""
        if self.pd is None:
            assert flight.req is not None
            return self._generated(flight.req, self.front[flight.front])
        first = 0 if math.isnan(self.rec.first_token[flight.slot]) else 1
        if flight.dreq is None:
            return first
        return max(first, first + self._generated(flight.dreq, self.back[flight.back]) - 1)

    def _check(self, gid: int, t: float) -> None:
        """Hand out the tokens the decision at t produced on replica gid."""
        rec = self.rec
        for slot, flight in list(self.watch[gid].items()):
            n = self.tokens(flight)
            done = bool(rec.status[slot] == OK)
            if n == flight.sent and not done:
                continue
            new = n - flight.sent
            if flight.sent == 0 and new > 0:
                flight.cached = int(rec.cached[slot])
            flight.sent = n
            if self.keep_times:
                flight.times.extend([t] * new)
            if done:
                flight.done = True
                del self.watch[gid][slot]
                self.free_slots.append(slot)
            self.emit(flight, new, t, done)
