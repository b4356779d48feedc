"""The simulator's event loop run online: requests arrive one by one at times nobody knew in advance.

`llmcap.sim.cluster.run_cluster` replays a known trace through `llmcap.sim.loop.ClusterLoop`; this feeds
the same loop (the same handoff, routers and `Replica` engines) by `submit` and advances it by
`run_until`, with the same order at equal times: an arrival before the decisions at its instant
(`run_until(t, inclusive=False)`, then `submit(..., t)`).

Replicas run in reference mode (one engine step per decision; identical results to the fast mode,
tests/sim), so after each decision the requests on that replica have exactly the tokens they have
at the step's end, and `emit` hands them out at that instant. Generated so far = `generated` for a request
outside the decoding set, generated_at_join + (steps since it joined) inside it.

Recorder rows are slots reused FIFO (a twin serves forever; the recorder is a fixed array), and the
step log keeps a histogram (itl_exact=False) whose dead steps are dropped: memory stays bounded.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from llmcap.sim.config import SimConfig
from llmcap.sim.engine import Replica, Req
from llmcap.sim.loop import ClusterLoop
from llmcap.sim.recorder import OK, UNFINISHED, Recorder
from llmcap.sim.steptime import StepTimer

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


class OnlineCluster:
    """The simulator's event loop (`llmcap.sim.loop.ClusterLoop`) over the twin's replicas, fed flights."""

    def __init__(
        self,
        timer: StepTimer,
        cfg: SimConfig,
        rng: np.random.Generator | None,
        emit: Emit,
        *,
        slots: int = DEFAULT_SLOTS,
        decode_timer: StepTimer | None = None,
        keep_times: bool = False,
        draws: int | None = None,
    ) -> None:
        """`draws`: the power-of-two router's pairs drawn at a time (default: `slots`); the simulator draws one
        batch for its whole trace, so a trace of n requests fed with draws=n is routed as `simulate` routes it."""
        self.cfg = cfg
        self.pd = cfg.pd
        self.emit = emit
        self.keep_times = keep_times
        self.rec = rec = Recorder(slots)
        self.free_slots: deque[int] = deque(range(slots))
        # one engine step per decision (tokens are known at every step's end); fixed pools and no clock
        # limit (a twin serves until stopped)
        online = cfg.model_copy(
            update={
                "reference": True,
                "timeseries_resolution_s": SAMPLE_EVERY_S,
                "autoscale": None,
                "decode_autoscale": None,
                "max_time_s": math.inf,
            }
        )
        rows = array("q", bytes(8 * slots))
        self.loop = ClusterLoop(
            online,
            timer,
            rec,
            rng,
            slots if draws is None else draws,
            rows,
            array("q", rows),
            decode_timer=decode_timer,
            itl_exact=False,
            on_decision=self._decided,
            on_landing=self._landed,
        )
        self.front, self.back, self.links = self.loop.front, self.loop.back, self.loop.links
        self.replicas = self.front + self.back
        self.watch: list[dict[int, Flight]] = [{} for _ in self.replicas]  # slot -> flight, per replica gid

    # ------------------------------------------------------------ inputs

    def fits(self, isl: int, osl: int) -> bool:
        """Whether the deployment can ever serve it (the simulator rejects the rest on arrival)."""
        return self.loop.fits(isl, osl)

    def reject(self) -> None:
        """A request that does not fit was turned away: it still counts in arrival order, as in the simulator."""
        self.loop.reject()

    @property
    def in_flight(self) -> int:
        return len(self.rec.status) - len(self.free_slots)

    @property
    def now(self) -> float:
        return self.loop.now

    def submit(self, flight: Flight, t: float) -> None:
        """A request arrives at engine time t (>= every decision already run). The caller checked
        `fits` and that a slot is free."""
        i = flight.slot = self.free_slots.popleft()
        self._reset_slot(i)
        self.loop.isl[i], self.loop.osl[i] = flight.isl, flight.osl
        caching = self.cfg.engine.enable_prefix_caching
        keys = flight.keys if caching else []
        block_ends = (
            (flight.block_ends if flight.block_ends is not None else list(range(1, len(keys) + 1))) if caching else []
        )
        req = self.loop.submit(i, t, keys, block_ends)
        assert req is not None, "submit a flight only when it fits"
        flight.req, flight.front = req, int(self.rec.prefill_replica[i])
        self._watch(flight, self.front[flight.front].gid)

    def _reset_slot(self, i: int) -> None:
        rec = self.rec
        for col in (
            rec.admitted,
            rec.first_token,
            rec.prefill_done,
            rec.decode_admitted,
            rec.finish,
            rec.transfer,
            rec.post,
            rec.itl_p50,
            rec.itl_p99,
            rec.itl_max,
        ):
            col[i] = math.nan
        rec.cached[i] = rec.host_cached[i] = rec.preemptions[i] = 0
        rec.prefill_replica[i] = rec.decode_replica[i] = -1
        rec.status[i] = UNFINISHED

    # ------------------------------------------------------------ the loop

    def next_time(self) -> float:
        """Engine time of the next decision or landing (INF: nothing to do until a request comes)."""
        return self.loop.next_time()

    def run_until(self, t: float, inclusive: bool = True) -> None:
        """Run every event before t (and at t when `inclusive`)."""
        self.loop.run_until(t, inclusive)

    def _decided(self, r: Replica, t: float) -> None:
        self._check(r.gid, t)

    def _landed(self, d: Replica, dreq: Req) -> None:
        """The request's KV landed on decode replica d: its tokens come from d's decisions from now."""
        flight = self.watch[self.front[int(self.rec.prefill_replica[dreq.i])].gid][dreq.i]
        flight.dreq, flight.back = dreq, d.index
        self._watch(flight, d.gid)

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
