"""The decoding set of a replica and runs of pure-decode steps, timed at once; the time series it samples.

Decoding sequences are not touched step by step: a replica-wide step clock `S` gives each one's
progress (generated = g0 + S - S0), a heap gives the next completion, per-phase counts give which step
needs new blocks. When a step has no prefill work and the waiting queue cannot be admitted, the next
steps are the same batch with the context growing by B per step until the next event (a completion,
block exhaustion, or something arriving from outside). That whole run is planned at once from its
start, batch and first context (`StepTimer.run_end`); where a step of it ended is found from a cursor
that the time-ordered outside queries move forward (`run_scan`). An arrival in the middle truncates the
run after the step in progress.

State seen from outside at time t (router, time series) is the state after every step that ended
strictly before t, with the step in progress scheduled (its blocks allocated).
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from heapq import heappop, heappush

from llmcap.sim.state import INF, Req
from llmcap.sim.steplog import StepLog

_ROW = struct.Struct("8q").pack  # one time-series row (DecodeRuns.state_at) as the bytes of `ts`


class DecodeRuns(StepLog):
    """A replica's decoding sequences on its step clock, and the run of pure-decode steps in progress."""

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

    def _complete(self, req: Req, t: float) -> None:
        """`req` generated its last token at t (the scheduler frees it)."""
        raise NotImplementedError
