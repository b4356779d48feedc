"""One replica: a vLLM-v1-like continuous-batching scheduler, advanced event by event.

Each step the scheduler runs the decoding sequences first (one token each), then continues partially
prefilled requests, then admits waiting requests FCFS — all within `max_num_batched_tokens` and
`max_num_seqs`; prompts are chunked to fit the budget. KV blocks are allocated for the tokens a step
computes (at admission and on growth); when they run out the newest running request is preempted and
later recomputed; blocks are freed at completion (see `kvcache` for the prefix cache).

Speed. Decoding sequences are not touched step by step: a replica-wide step clock `S` gives each one's
progress (generated = g0 + S - S0), a heap gives the next completion, per-phase counts give which step
needs new blocks. When a step has no prefill work and the waiting queue cannot be admitted, the next
steps are the same batch with the context growing by B per step until the next event (a completion,
block exhaustion, or something arriving from outside). That whole run is planned at once from its
start, batch and first context (`StepTimer.run_end`); where a step of it ended is found from a cursor
that the time-ordered outside queries move forward (`run_scan`). An arrival in the middle truncates the
run after the step in progress. Steps reach the step log (durations and regular-gap weights, for the
exact ITL distribution and per-request ITL stats) in bulk: `flush_log` writes pending runs with one
vectorised pass every FLUSH_STEPS steps, then computes the ITL stats of the requests that finished.
`reference=True` plans runs of one step, calling the scheduler every step; both produce identical
results (tests/sim).

State seen from outside at time t (router, time series) is the state after every step that ended
strictly before t, with the step in progress scheduled (its blocks allocated).
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections import deque
from heapq import heappop, heappush

import numpy as np
from array import array

from llmcap.sim.config import EngineConfig
from llmcap.sim.kvcache import KVCache, Run, Seg
from llmcap.sim.recorder import OK, Recorder
from llmcap.sim.segments import SegmentIndex
from llmcap.sim.steptime import StepTimer

INF = float("inf")
TRIM_STEPS = 1 << 16  # histogram mode: look for dead steps to drop once the log is this long (16 B a step)
FLUSH_STEPS = 1 << 13  # pending steps written to the log in one vectorised pass (see `flush_log`)
HIST_BINS_PER_DECADE = 1000  # histogram mode: bins 0.23% wide
HIST_MIN_S, HIST_DECADES = 1e-7, 12  # 0.1 µs .. 1e5 s
_ROW = struct.Struct("8q").pack  # one time-series row (Replica.state_at) as the bytes of `ts`


def itl_histogram(durations: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Token counts per log-spaced ITL bin (bin i covers [HIST_MIN_S·10^(i/B), HIST_MIN_S·10^((i+1)/B)))."""
    n = HIST_BINS_PER_DECADE * HIST_DECADES
    with np.errstate(divide="ignore"):
        idx = np.floor(np.log10(np.maximum(durations, HIST_MIN_S) / HIST_MIN_S) * HIST_BINS_PER_DECADE)
    idx = np.clip(idx, 0, n - 1).astype(np.int64)
    return np.bincount(idx, weights=weights.astype(np.float64), minlength=n).astype(np.int64)


class Req:
    """A request inside one replica (created when it arrives there, dropped when it leaves)."""

    __slots__ = (
        "i", "isl", "osl", "g", "n_comp", "alloc", "keys", "his", "segs", "seg_blocks", "reg", "stamp",
        "S0", "g0", "nc0", "fin", "ver", "last_tok", "eps", "pre", "xfer", "dec", "admitted", "handoff_t", "single", "lazy_lo",
        "lazy_n", "lazy_blocks",
    )  # fmt: skip

    def __init__(self, i: int, isl: int, osl: int, keys: list[int] | None = None, his: list[int] | None = None) -> None:
        self.i = i
        self.isl = isl
        self.osl = osl  # tokens this replica generates before the request leaves it
        self.g = 0  # tokens generated so far
        self.n_comp = 0  # tokens whose KV is computed (or loaded)
        self.alloc = 0  # tokens with KV slots allocated
        self.keys = keys  # None until admission (waiting requests hold no lists)
        self.his = his if his is not None else []
        self.segs: list[Seg] = []  # prefix segments this request holds a reference to
        self.seg_blocks = 0
        self.reg = 0  # next own segment to publish
        self.single = 0  # chain position where the singleton suffix starts (set at admission)
        self.lazy_lo = -1  # first singleton segment counted instead of published (segments [lazy_lo, reg))
        self.lazy_n = 0  # ... of them non-empty
        self.lazy_blocks = 0
        self.stamp = 0
        self.S0 = self.g0 = self.nc0 = self.fin = 0
        self.ver = 0
        self.last_tok = 0.0
        self.eps: list[tuple[int, int]] = []  # decode episodes [S_a, S_b) on the replica's step log
        self.pre = 0
        self.xfer = False  # arrived by KV transfer (P/D decode side)
        self.dec = False
        self.admitted = False
        self.handoff_t = 0.0


class Replica:
    """One engine. Drive it with `add`, `release`, and `advance` at `next_time`."""

    def __init__(
        self,
        index: int,
        cfg: EngineConfig,
        timer: StepTimer,
        rec: Recorder,
        *,
        role: str = "both",
        reference: bool = False,
        max_run_steps: int = 1 << 16,
        resolution_s: float = 1.0,
        first_token_at_handoff: bool = False,
        segments: SegmentIndex | None = None,
        itl_exact: bool = True,
    ) -> None:
        self.index = index
        self.gid = index  # position in the whole cluster (the cluster sets it; heap ties)
        self.horizon = INF  # set by the cluster: the next outside event, a hint for planning run lengths
        self.cfg = cfg
        self.bs = cfg.block_size
        self.max_batched = cfg.max_num_batched_tokens  # plain ints: read every step
        self.max_seqs = cfg.max_num_seqs
        self.timer = timer
        self.rec = rec
        self.role = role  # "both" | "prefill" (leaves after the first token, blocks held) | "decode"
        self.caching = cfg.enable_prefix_caching and role != "decode"
        # singleton segments kept as one LRU entry per finished request (kvcache.Run) when the index says
        # where they start (the cluster asks for that unless a host tier or the reference mode is on)
        self.lazy = self.caching and segments is not None and segments.singles is not None
        self.max_run = 1 if reference else max_run_steps
        self.first_token_at_handoff = first_token_at_handoff
        self.segments_of = segments  # request index -> (chain hashes, segment block ends), fetched at admission
        self.kv = KVCache(cfg.num_blocks, cfg.host_blocks if self.caching else 0)
        self.host_s_per_block = cfg.block_size * cfg.kv_bytes_per_token / cfg.host_bandwidth_bytes_s
        self.running: dict[int, Req] = {}  # stamp -> request, admission order
        self.partials: dict[int, Req] = {}  # running requests still prefilling
        self.waiting: deque[Req] = deque()
        self.held: dict[int, Req] = {}  # prefill role: done, blocks kept until the handoff lands
        self.stamps = 0
        # decoding set, advanced by the step clock
        self.S = 0  # steps completed = index of the next step
        self.B = 0
        self.ctx_sum = 0  # Σ context (prompt + generated) of decodes at step S
        self.phase = [0] * self.bs  # decodes by (nc0 - S0) mod bs: who needs a block at which step
        self.fin_heap: list[tuple[int, int, int, Req]] = []  # (last step, stamp, version, request)
        self.outstanding = 0  # Σ tokens still to process: isl + osl - 1 - n_comp
        self.inbound = 0  # P/D decode side: tokens of handoffs sent to it that have not landed yet (the router counts them)
        # the plan in progress: a step or a run of pure-decode steps [done, k) starting at t0
        self.busy = False
        self.t = 0.0  # time of the last decision
        self.run_ends: list[float] = []
        self.run_durs: array[float] = array("d")
        self.run_k = 0
        self.run_done = 0
        self.run_alloc = 0  # steps of the run whose blocks are allocated
        self.run_S = 0
        self.run_decode = False
        # a decode run timed on demand (StepTimer.on_demand): no per-step lists, only its start, first
        # context and a cursor (step cur_j starts at cur_t) that the monotone outside queries move forward;
        # the time-series grid has its own (smp_j, smp_t): the two sequences are each monotone, not together
        self.run_lazy = False
        self.run_t0 = 0.0
        self.run_ctx0 = 0
        self.cur_j = 0
        self.cur_t = 0.0
        self.smp_j = 0
        self.smp_t = 0.0
        self.entries: list[tuple[Req, int]] = []  # prefill chunks (and handoff first decodes) of a single step
        self.entry_B = 0  # decodes of that step with a regular gap (their last token ended the previous step)
        self.next_time = INF
        self.version = 0
        # logs and counters
        self.tokens = 0
        self.hit_tokens = 0
        self.preemptions = 0
        self.finished = 0
        self._host_load = 0.0
        self.outputs: list[Req] = []  # prefill role: requests that finished prefill this advance
        self.res = resolution_s
        self.grid_i = 0
        self.ts = array("q")  # 8 ints per grid time (see state_at); row i is at time i·resolution
        # step log: duration and regular-gap decode count per step, from step index log_base on, as the
        # chunks `flush_log` wrote (chunk i holds steps from chunk_at[i] on; no copying as it grows). Steps
        # reach it through `pend_*` (a segment: n steps of a decode run from context ctx, b >= 0; or n
        # literal durations in pend_lit, b = -1; weight w each); the ITL stats of requests that finished
        # (`stats_due`) wait for the flush.
        self.log_base = 0
        self.log_n = 0  # steps in the chunks
        self.chunk_d: list[np.ndarray] = []
        self.chunk_w: list[np.ndarray] = []
        self.chunk_at: list[int] = []
        # (lists: a compiled list append is a C call; array('q').append parses its argument)
        self.pend_b: list[int] = []
        self.pend_ctx: list[int] = []
        self.pend_n: list[int] = []
        self.pend_w: list[int] = []
        self.pend_lit = array("d")
        self.pend_steps = 0
        self.stats_due: list[Req] = []
        self.trim_at = TRIM_STEPS  # histogram mode: log length of the next trim attempt
        self.hist = None if itl_exact else np.zeros(HIST_BINS_PER_DECADE * HIST_DECADES, dtype=np.int64)

    # ---------------------------------------------------------------- outside view

    def _steps_before(self, t: float, sampling: bool = False) -> int:
        """Run steps (absolute index in the run) that ended strictly before t (`sampling`: a grid time)."""
        if not self.run_decode:
            return self.run_done
        if not self.run_lazy:
            return bisect_left(self.run_ends, t, self.run_done, self.run_k)
        # walk from the furthest cursor whose step starts before t (else from the run's start)
        j0, t0 = 0, self.run_t0
        if self.cur_t < t and self.cur_j > j0:
            j0, t0 = self.cur_j, self.cur_t
        if self.smp_t < t and self.smp_j > j0:
            j0, t0 = self.smp_j, self.smp_t
        j, start = self.timer.run_scan(t0, self.B, self.run_ctx0, j0, self.run_k, t)
        if sampling:
            self.smp_j, self.smp_t = j, start
        else:
            self.cur_j, self.cur_t = j, start
        return j if j > self.run_done else self.run_done

    def _run_end(self, m: int) -> float:
        """End of run step m."""
        if not self.run_lazy:
            return self.run_ends[m]
        if self.cur_j <= m:
            return self.timer.run_end(self.cur_t, self.B, self.run_ctx0, self.cur_j, m + 1)
        return self.timer.run_end(self.run_t0, self.B, self.run_ctx0, 0, m + 1)

    def outstanding_at(self, t: float) -> int:
        if self.run_decode:
            return self.outstanding - (self._steps_before(t) - self.run_done) * self.B
        return self.outstanding

    def _allocs(self, a: int, b: int) -> int:
        """Blocks the decodes of the current run allocate in run steps [a, b)."""
        if b <= a:
            return 0
        bs, phase, s = self.bs, self.phase, self.run_S
        n = b - a
        total = (n // bs) * self.B
        for j in range(a + (n // bs) * bs, b):
            total += phase[(-(s + j)) % bs]
        return total

    def state_at(self, t: float) -> tuple[int, int, int, int, int, int, int, int]:
        kv_used, tokens, steps = self.kv.used, self.tokens, self.S
        if self.busy and self.run_decode:
            m = self._steps_before(t, sampling=True)
            started = min(m + 1, self.run_k)
            kv_used += self._allocs(self.run_alloc, started)
            tokens += (m - self.run_done) * self.B
            steps += m - self.run_done
        return (len(self.running), len(self.waiting), kv_used, tokens, steps, self.hit_tokens, self.preemptions, self.finished)

    def sample_until(self, t: float) -> None:
        """Time-series rows for every grid time <= t not yet sampled (state after events before it)."""
        g = self.grid_i * self.res
        while g <= t:
            self.ts.frombytes(_ROW(*self.state_at(g)))  # (array.extend converts a tuple item by item: ~2x slower)
            self.grid_i += 1
            g = self.grid_i * self.res

    def sync(self, t: float) -> None:
        """Apply the run's steps that ended before t and the allocation of the step in progress (so
        the prefix cache reflects evictions up to t); the plan itself is unchanged."""
        if not (self.busy and self.run_decode):
            return
        self.sample_until(t)
        m = self._steps_before(t)
        self._commit(m)
        started = min(m + 1, self.run_k)
        if started > self.run_alloc:
            self.kv.alloc(self._allocs(self.run_alloc, started))
            self.run_alloc = started

    def prefix_hit_tokens(self, keys: list[int], his: list[int], isl: int) -> int:
        """Tokens of a prompt with these segments that this replica's HBM cache would serve now."""
        if not self.caching:
            return 0
        segs, bs, cap = self.kv.segments, self.bs, (isl - 1) // self.bs
        hit = lo = 0
        for key, hi in zip(keys, his):
            if hi == lo:
                continue
            if hi > cap or key not in segs:
                break
            hit, lo = hi, hi
        return hit * bs

    # ---------------------------------------------------------------- inputs

    def _wake(self, t: float) -> bool:
        """Truncate the plan so the scheduler runs at the end of the step in progress at t (or at t
        when idle). True when `next_time` changed."""
        if not self.busy:
            self.busy = True
            self.run_decode = False
            self.entries = []
            self.run_k = self.run_done = 0
            self.t = t
            self.next_time = t
            self.version += 1
            return True
        if self.run_decode:
            m = self._steps_before(t)
            if m + 1 < self.run_k:
                self.run_k = m + 1
                self.next_time = self._run_end(m)
                self.version += 1
                return True
        return False

    def add(self, req: Req, t: float) -> bool:
        """A request arrives (or its KV lands, P/D). True when `next_time` changed."""
        self.sample_until(t)
        self.outstanding += req.isl + req.osl - 1 - req.n_comp
        self.waiting.append(req)
        return self._wake(t)

    def release(self, req: Req, t: float) -> bool:
        """Prefill role: the handoff of `req` landed; free its blocks."""
        self.sample_until(t)
        del self.held[req.stamp]
        self._free(req, preempted=False)
        return self._wake(t) if self.waiting else False

    # ---------------------------------------------------------------- the loop

    def advance(self) -> None:
        """Finish the plan ending at `next_time`, then schedule the next step (or go idle)."""
        t = self.next_time
        self.sample_until(t)
        if self.run_decode:
            self._commit(self.run_k)
            if self.run_k > self.run_alloc:
                self.kv.alloc(self._allocs(self.run_alloc, self.run_k))
            self._finish_decodes(t)
        elif self.run_k:
            self._commit_step(t)
        self.t = t
        self._decide(t)

    def _commit(self, m: int) -> None:
        """Account run steps [run_done, m) as executed."""
        n = m - self.run_done
        if n <= 0:
            return
        b = self.B
        if self.run_lazy:
            self._log(b, self.run_ctx0 + self.run_done * b, n, b)
        else:
            self.pend_lit.extend(self.run_durs[self.run_done : m])  # array to array: a copy, not a per-item parse
            self._log(-1, 0, n, b)
        self.S += n
        self.ctx_sum += n * b
        self.outstanding -= n * b
        self.tokens += n * b
        self.run_done = m

    def _commit_step(self, t: float) -> None:
        """A single (mixed) step ended at t: decodes emit, prefill chunks advance."""
        b = self.B
        self.pend_lit.append(self.run_durs[0])
        self._log(-1, 0, 1, self.entry_B)
        self.S += 1
        self.ctx_sum += b
        done = b
        emitted = []
        for req, c in self.entries:
            req.n_comp += c
            done += c
            if req.n_comp == req.isl + req.g:  # the step computed the last known token: one more comes out
                emitted.append(req)
        self.outstanding -= done
        self.tokens += done
        self.run_k = self.run_done = 1
        self._finish_decodes(t)
        for req in emitted:
            self._emit(req, t)
        for req in emitted:
            if req.g < req.osl and self.role != "prefill":
                self._join_decode(req)
        self.entries = []

    def _log(self, b: int, ctx: int, n: int, w: int) -> None:
        """n more steps in the step log (see `pend_*`)."""
        self.pend_b.append(b)
        self.pend_ctx.append(ctx)
        self.pend_n.append(n)
        self.pend_w.append(w)
        self.pend_steps += n
        if self.pend_steps >= FLUSH_STEPS:
            self.flush_log()

    def flush_log(self) -> None:
        """Write the pending steps to the step log in one vectorised pass, then compute the ITL stats of the
        requests that finished since the last flush (the cluster calls it once more at the end)."""
        if self.pend_steps:
            n = np.array(self.pend_n, dtype=np.int64)
            b = np.array(self.pend_b, dtype=np.int64)
            lit = np.frombuffer(self.pend_lit, dtype=np.float64)
            if lit.size == self.pend_steps:
                dur = lit.copy()
            else:
                # per-segment values repeated, no gathers: step s of segment k (from step first[k] on) has
                # context ctx[k] + (s - first[k])·b[k], an exact integer; literal segments are timed as
                # b = 0 and then overwritten (1.5x faster than timing the decode steps picked by a mask)
                first = np.cumsum(n) - n
                bt = np.maximum(b, 0)
                step_b = np.repeat(bt, n)
                ctx = np.repeat(np.array(self.pend_ctx, dtype=np.int64) - first * bt, n)
                ctx += np.arange(self.pend_steps) * step_b
                dur = self.timer.decode_durations(step_b, ctx.astype(np.float64))  # exact: below 2**53
                if lit.size:
                    dur[np.repeat(b < 0, n)] = lit
            self.chunk_at.append(self.log_base + self.log_n)
            self.chunk_d.append(dur)
            self.chunk_w.append(np.repeat(np.array(self.pend_w, dtype=np.int64), n))
            self.log_n += dur.size
            del lit  # the view exports pend_lit's buffer: a new array, not a resized one
            self.pend_b.clear()
            self.pend_ctx.clear()
            self.pend_n.clear()
            self.pend_w.clear()
            self.pend_lit = array("d")
            self.pend_steps = 0
        due, self.stats_due = self.stats_due, []
        for req in due:
            self._itl_stats(req)
        if self.hist is not None and self.log_n > self.trim_at:
            self._trim()

    def _emit(self, req: Req, t: float) -> None:
        """`req` produced a token at the end of a non-decode step (prefill, recompute, handoff entry)."""
        rec = self.rec
        req.g += 1
        if req.stamp in self.partials:
            del self.partials[req.stamp]
        if req.g == 1:
            rec.prefill_done[req.i] = t
            if not (self.role == "prefill" and self.first_token_at_handoff):
                rec.first_token[req.i] = t
        else:
            rec.extra_gaps.append(t - req.last_tok)
            req.eps.append((-1, len(rec.extra_gaps) - 1))  # marks one explicit gap
        req.last_tok = t
        if self.role == "prefill":
            del self.running[req.stamp]
            self.held[req.stamp] = req
            self.outputs.append(req)
        elif req.g >= req.osl:
            self._complete(req, t)

    def _join_decode(self, req: Req) -> None:
        S = self.S
        req.dec = True
        req.S0, req.g0, req.nc0 = S, req.g, req.n_comp
        req.fin = S + (req.osl - req.g) - 1
        self.B += 1
        self.ctx_sum += req.n_comp + 1
        self.phase[(req.n_comp - S) % self.bs] += 1
        heappush(self.fin_heap, (req.fin, req.stamp, req.ver, req))

    def _leave_decode(self, req: Req, S: int) -> None:
        """Materialise a decode's progress at step clock S and take it out of the decoding set."""
        n = S - req.S0
        req.g = req.g0 + n
        req.n_comp = req.nc0 + n
        req.alloc = req.n_comp
        req.dec = False
        req.ver += 1
        if n > 0:
            req.eps.append((req.S0, S))
        self.B -= 1
        self.ctx_sum -= req.n_comp + 1
        self.phase[(req.nc0 - req.S0) % self.bs] -= 1

    def _finish_decodes(self, t: float) -> None:
        heap, last = self.fin_heap, self.S - 1
        while heap and heap[0][0] <= last:
            _, _, ver, req = heappop(heap)
            if ver != req.ver:
                continue
            self._leave_decode(req, self.S)
            req.last_tok = t
            self._complete(req, t)

    def _complete(self, req: Req, t: float) -> None:
        rec = self.rec
        rec.finish[req.i] = t
        rec.status[req.i] = OK
        self.stats_due.append(req)
        del self.running[req.stamp]
        self.partials.pop(req.stamp, None)
        self._free(req, preempted=False)
        self.finished += 1

    def step_log(self) -> tuple[np.ndarray, np.ndarray]:
        """The step log kept so far (after `flush_log`): durations and regular-gap weights, one copy."""
        if not self.chunk_d:
            return np.empty(0), np.empty(0, dtype=np.int64)
        return np.concatenate(self.chunk_d), np.concatenate(self.chunk_w)

    def _log_slice(self, a: int, b: int) -> np.ndarray:
        """Durations of steps [a, b) (absolute indices, inside the log): a view when one chunk holds them."""
        at, chunks = self.chunk_at, self.chunk_d
        i = bisect_right(at, a) - 1
        lo = a - at[i]
        if b - at[i] <= len(chunks[i]):
            return chunks[i][lo : b - at[i]]
        parts = [chunks[i][lo:]]
        i += 1
        while b - at[i] > len(chunks[i]):
            parts.append(chunks[i])
            i += 1
        parts.append(chunks[i][: b - at[i]])
        return np.concatenate(parts)

    def _itl_stats(self, req: Req) -> None:
        """The request's ITL p50 / p99 (linear between order statistics, numpy's default) and max."""
        if req.osl <= 1 or not req.eps:
            return
        extra = self.rec.extra_gaps
        a0, b0 = req.eps[0]
        if len(req.eps) == 1 and a0 >= 0:
            v = self._log_slice(a0, b0).copy()  # (methods, not np.sort: its Python wrapper costs more here)
        else:
            v = np.concatenate([self._log_slice(a, b) if a >= 0 else np.array([extra[b]]) for a, b in req.eps])
        v.sort()  # order statistics do not depend on the algorithm
        m = len(v)
        rec, i = self.rec, req.i
        for q, col in ((0.5, rec.itl_p50), (0.99, rec.itl_p99)):
            x = q * (m - 1)
            lo = int(x)  # floor and ceil of x >= 0
            hi = lo + 1 if x > lo else lo
            v_lo = float(v.item(lo))  # (.item: no numpy scalar in between)
            col[i] = v_lo + (float(v.item(hi)) - v_lo) * (x - lo)
        rec.itl_max[i] = float(v.item(m - 1))

    def _free(self, req: Req, preempted: bool) -> None:
        kv = self.kv
        own = -(-req.alloc // self.bs) - req.seg_blocks
        freed = 0
        counted = req.lazy_n
        if req.lazy_lo >= 0:  # the singleton tail first, as the release below goes
            if counted:
                self._free_singletons(req, preempted)
            req.lazy_lo = -1
            req.lazy_n = req.lazy_blocks = 0
        for seg in reversed(req.segs):  # tail first: the LRU evicts a prompt's end before its start
            seg.ref -= 1
            if seg.ref == 0:
                kv.unpin(seg)
                freed += seg.blocks
        kv.free += freed
        if preempted and self.caching:
            chain = sum(1 for j, hi in enumerate(req.his) if hi > (req.his[j - 1] if j else 0))
            if len(req.segs) + counted == chain:  # own blocks continue the cached chain: keep them for recompute
                private = req.alloc // self.bs - (req.his[-1] if req.his else 0)
                if private > 0:
                    kv.keep_private(("p", req.i), private)
                    own -= private
        kv.release(own)
        req.segs = []
        req.seg_blocks = 0
        req.reg = 0
        req.alloc = 0

    def _free_singletons(self, req: Req, preempted: bool) -> None:
        """Free the request's counted singleton segments [lazy_lo, reg) as evictable: one `Run` entry, or,
        preempted, kept one by one, tail first, for its recompute to hit (private to it: nobody else can)."""
        kv = self.kv
        run = Run(req.keys if req.keys is not None else [], req.his, req.lazy_lo, req.reg, req.lazy_blocks)
        if not preempted:
            kv.unpin_run(run, req.lazy_n)
            return
        for key, nb in run.members():  # tail first
            kv.keep_private(key, nb)

    def _preempt(self, req: Req, allocated_this_step: bool) -> None:
        if req.dec:
            self._leave_decode(req, self.S)
            req.last_tok = self.t
            if allocated_this_step:
                req.alloc += 1
        del self.running[req.stamp]
        self.partials.pop(req.stamp, None)
        self.outstanding += req.n_comp
        self._free(req, preempted=True)
        req.n_comp = 0
        req.pre += 1
        self.rec.preemptions[req.i] = req.pre
        self.preemptions += 1
        self.waiting.appendleft(req)

    def _make_room(self, need: int, req: Req, allocated: bool) -> bool:
        """Preempt the newest running requests until `need` blocks are free; False if `req` itself went."""
        while self.kv.free < need:
            victim = self.running[next(reversed(self.running))]
            self._preempt(victim, allocated and victim.dec)
            if victim is req:
                return False
        return True

    def _register(self, req: Req) -> None:
        """Publish the request's segments that its allocated blocks now fully cover."""
        his, segments = req.his, self.kv.segments
        keys = req.keys if req.keys is not None else []
        full = req.alloc // self.bs
        j, n = req.reg, len(his)
        lo = his[j - 1] if j else 0
        segs = req.segs
        added = 0
        single = req.single if self.lazy and req.pre == 0 else n  # a preempted request publishes them all
        while j < n:
            hi = his[j]
            if hi > full:
                break
            if j >= single:  # a singleton: counted here, queued with the others at the end (kvcache.Run)
                if req.lazy_lo < 0:
                    req.lazy_lo = j
                if hi > lo:
                    req.lazy_n += 1
                    req.lazy_blocks += hi - lo
                    added += hi - lo
            elif hi > lo:
                key = keys[j]
                if key not in segments:  # else another request published it first: these stay ours
                    seg = segments[key] = Seg(key, 1, hi - lo)
                    segs.append(seg)
                    added += hi - lo
            lo = hi
            j += 1
        req.seg_blocks += added
        req.reg = j

    def _admit(self, req: Req, budget: int, t: float) -> int:
        """Try to admit the waiting head; tokens scheduled, or 0 when it does not fit now."""
        bs, kv = self.bs, self.kv
        n_tok = req.isl + req.g
        hits: list = []
        host_hits: list = []
        hit_blocks = lru_blocks = host_blocks = 0
        private = None
        reg = 0
        if self.caching and req.keys is None:
            req.keys, req.his = self.segments_of.of(req.i) if self.segments_of is not None else ([], [])
        if self.lazy and not req.admitted and self.segments_of is not None:
            req.single = self.segments_of.single_from(req.i)
        if self.caching and not req.xfer:
            segs = kv.segments
            host = kv.host
            cap = (n_tok - 1) // bs
            lo = 0
            chained = True
            for key, hi in zip(req.keys if req.keys is not None else [], req.his):
                if hi == lo:
                    reg += 1
                    continue
                if hi > cap:
                    chained = False
                    break
                seg = segs.get(key)
                if seg is not None and not host_hits:
                    hits.append(seg)
                    hit_blocks = hi
                    if seg.ref == 0:
                        lru_blocks += seg.blocks
                elif host is not None and key in host:
                    host_hits.append((key, hi - lo))
                    host_blocks += hi - lo
                else:
                    chained = False
                    break
                lo = hi
                reg += 1
            if chained and not host_hits:
                pseg = segs.get(("p", req.i))
                if pseg is not None:
                    private = min(pseg.blocks, cap - hit_blocks)
        hit_tok = (hit_blocks + host_blocks + (private or 0)) * bs
        if req.xfer:
            hit_tok = req.n_comp
        c = min(n_tok - hit_tok, budget)
        need = -(-(hit_tok + c) // bs) - hit_blocks - (private or 0)
        if need > kv.free - lru_blocks - (private or 0):  # hits leave the free pool when taken
            return 0
        for seg in hits:
            kv.acquire(seg)
            req.segs.append(seg)
        req.seg_blocks = hit_blocks
        if private is not None:
            nb = kv.take_private(("p", req.i))
            kv.release(nb - private)  # whatever the cap leaves out is plain free space again
        kv.alloc(need)
        for key, nb in host_hits:
            kv.host_take(key)
            req.segs.append(kv.register(key, nb))
            req.seg_blocks += nb
        req.n_comp = hit_tok
        req.alloc = hit_tok + c
        req.reg = reg
        if self.caching and req.his:
            self._register(req)
        if not req.xfer:
            cached = min(hit_tok, req.isl)
            self.rec.cached[req.i] = cached
            self.rec.host_cached[req.i] = min(host_blocks * bs, cached)
            self.hit_tokens += hit_tok
            self.outstanding -= hit_tok
        if not req.admitted:
            req.admitted = True
            if self.role != "decode":
                self.rec.admitted[req.i] = t
            else:
                self.rec.decode_admitted[req.i] = t
                if self.first_token_at_handoff:
                    self.rec.first_token[req.i] = t
                    req.last_tok = t
        self.stamps += 1
        req.stamp = self.stamps
        self.running[req.stamp] = req
        self._host_load += host_blocks * self.host_s_per_block
        return c

    def _decide(self, t: float) -> None:
        """Schedule the step starting at t (vLLM v1 order), or a run of pure-decode steps, or go idle."""
        bs, kv, max_seqs = self.bs, self.kv, self.max_seqs
        S = self.S
        budget = self.max_batched
        preempted_before = self.preemptions
        self._host_load = 0.0
        entries: list[tuple[Req, int]] = []
        # 1. decodes, one token each, in admission order
        if self.B:
            need = self.phase[(-S) % bs]
            if need <= kv.free:
                kv.alloc(need)
            else:
                for req in [r for r in self.running.values() if r.dec]:
                    if not req.dec or (req.nc0 - req.S0 + S) % bs:
                        continue
                    if self._make_room(1, req, allocated=False):
                        kv.alloc(1)
            budget -= self.B
        # 2. partially prefilled requests
        for stamp in list(self.partials):
            part = self.partials.get(stamp)
            if part is None:
                continue
            if budget <= 0:
                break
            c = min(part.isl + part.g - part.n_comp, budget)
            need = -(-(part.n_comp + c) // bs) - (-(-part.alloc // bs))
            if not self._make_room(need, part, allocated=True):
                continue
            kv.alloc(need)
            part.alloc = part.n_comp + c
            if self.caching and part.his:
                self._register(part)
            entries.append((part, c))
            budget -= c
        budget = self.max_batched - self.B - sum(c for _, c in entries)  # victims give theirs back
        # 3. waiting requests, FCFS, unless this step preempted
        if self.preemptions == preempted_before:
            waiting = self.waiting
            while waiting and budget > 0 and len(self.running) < max_seqs:
                req = waiting[0]
                c = self._admit(req, budget, t)
                if c == 0:
                    break
                waiting.popleft()
                entries.append((req, c))
                if req.n_comp + c < req.isl + req.g:
                    self.partials[req.stamp] = req
                budget -= c
        if entries:
            self._plan_step(t, entries)
        elif self.B:
            self._plan_run(t, single=self.preemptions != preempted_before)
        else:
            self.busy = False
            self.run_decode = False
            self.run_k = self.run_done = 0
            self.next_time = INF
            self.version += 1

    def _plan_step(self, t: float, entries: list[tuple[Req, int]]) -> None:
        p_tok = p_pairs = p_seqs = 0.0
        d_seqs, d_ctx = self.B, self.ctx_sum
        d_max = 0
        if not self.timer.linear and self.B:
            d_max = max(r.nc0 + (self.S - r.S0) + 1 for r in self.running.values() if r.dec)
        for req, c in entries:
            if c == 1 and req.g >= 1 and req.n_comp == req.isl + req.g - 1:  # a decode token (handoff entry)
                d_seqs += 1
                d_ctx += req.n_comp + 1
                d_max = max(d_max, req.n_comp + 1)
            else:
                p_tok += c
                p_pairs += c * req.n_comp + c * (c + 1) / 2.0
                p_seqs += 1
        dur = self.timer.one(p_tok, p_pairs, p_seqs, float(d_seqs), float(d_ctx), float(d_max)) + self._host_load
        self.entries = entries
        self.entry_B = self.B
        self.run_decode = False
        self.run_durs = array("d", (dur,))
        self.run_ends = [t + dur]
        self.run_k, self.run_done = 1, 0
        self.busy = True
        self.next_time = t + dur
        self.version += 1

    def _plan_run(self, t: float, single: bool) -> None:
        S, B, bs = self.S, self.B, self.bs
        k = 1 if single else self.max_run
        heap = self.fin_heap
        while heap and heap[0][2] != heap[0][3].ver:
            heappop(heap)
        k = min(k, heap[0][0] - S + 1)
        if k > 1 and self.horizon < INF and self.timer.linear:  # the next outside event will likely cut the run
            d0 = self.timer.one(0.0, 0.0, 0.0, float(B), float(self.ctx_sum), 0.0)
            if d0 > 0:
                k = min(k, int((self.horizon - t) / d0) + 2)
        if k > 1:  # block exhaustion: run steps 1.. allocate per phase; stop before the first that cannot.
            # With requests waiting, also stop before the first eviction: it can change what their
            # admission needs (a hit turns into work), so the scheduler must look again.
            free = self.kv.plain if self.waiting else self.kv.free
            if B * ((k - 1) // bs + 1) > free:
                cycles = free // B
                left = free - cycles * B
                j = cycles * bs + 1
                phase = self.phase
                while True:
                    left -= phase[(-(S + j)) % bs]
                    if left < 0:
                        break
                    j += 1
                k = min(k, j)
        d_max = 0
        if not self.timer.linear:
            d_max = max(r.nc0 + (S - r.S0) + 1 for r in self.running.values() if r.dec)
        if self.timer.on_demand(B):
            self.run_lazy = True
            self.run_t0, self.run_ctx0, self.cur_j, self.cur_t = t, self.ctx_sum, 0, t
            self.smp_j, self.smp_t = 0, t
            self.next_time = self.timer.run_end(t, B, self.ctx_sum, 0, k)
        else:
            self.run_lazy = False
            self.run_durs, self.run_ends = self.timer.decode_run(t, B, self.ctx_sum, d_max, k)
            self.next_time = self.run_ends[-1]
        self.run_decode = True
        self.run_k, self.run_done, self.run_alloc, self.run_S = k, 0, 1, S
        self.busy = True
        self.version += 1

    def _trim(self) -> None:
        """Histogram mode: fold the chunks of steps no live request still needs into `hist` and drop them."""
        live = [self.S]
        for req in list(self.running.values()) + list(self.waiting):
            if req.dec:
                live.append(req.S0)
            live.extend(a for a, _ in req.eps if a >= 0)
        cut = min(live)
        dead = 0
        while dead + 1 < len(self.chunk_at) and self.chunk_at[dead + 1] <= cut:  # chunk `dead` ends by cut
            self.hist += itl_histogram(self.chunk_d[dead], self.chunk_w[dead])
            self.log_n -= len(self.chunk_d[dead])
            dead += 1
        if dead:
            del self.chunk_d[:dead], self.chunk_w[:dead], self.chunk_at[:dead]
            self.log_base = self.chunk_at[0]
        # a long-lived request holds the log: look again at twice the length
        self.trim_at = max(TRIM_STEPS, 2 * self.log_n)
