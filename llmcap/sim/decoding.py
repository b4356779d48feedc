"""The decoding set of a replica and runs of pure-decode steps, timed at once; the time series it samples.

Decoding sequences are not touched step by step: a replica-wide step clock (`step_clock`) gives each
one's progress (generated = generated_at_join + step_clock - joined_at_step), a heap gives the next completion, per-phase counts give which step
needs new blocks. When a step has no prefill work and the waiting queue cannot be admitted, the next
steps are the same batch with the context growing by `decode_batch` per step until the next event (a completion,
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

from llmcap.sim.admission import CLIP_NEW_TOKENS, lifetime_blocks
from llmcap.sim.request import Req
from llmcap.sim.state import INF
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
        if self.cursor_start < t and self.cursor_step > j0:
            j0, t0 = self.cursor_step, self.cursor_start
        if self.sample_start < t and self.sample_step > j0:
            j0, t0 = self.sample_step, self.sample_start
        j, start = self.timer.run_scan(t0, self.decode_batch, self.run_ctx0, j0, self.run_k, t)
        if sampling:
            self.sample_step, self.sample_start = j, start
        else:
            self.cursor_step, self.cursor_start = j, start
        return j if j > self.run_done else self.run_done

    def _run_end(self, m: int) -> float:
        """End of run step m."""
        if not self.run_lazy:
            return self.run_ends[m]
        if self.cursor_step <= m:
            return self.timer.run_end(self.cursor_start, self.decode_batch, self.run_ctx0, self.cursor_step, m + 1)
        return self.timer.run_end(self.run_t0, self.decode_batch, self.run_ctx0, 0, m + 1)

    def outstanding_at(self, t: float) -> int:
        if self.run_decode:
            return self.outstanding - (self._steps_before(t) - self.run_done) * self.decode_batch
        return self.outstanding

    def _allocs(self, a: int, b: int) -> int:
        """Blocks the decodes of the current run allocate in run steps [a, b)."""
        if b <= a:
            return 0
        bs, phase, s = self.bs, self.phase, self.run_S
        n = b - a
        total = (n // bs) * self.decode_batch
        for j in range(a + (n // bs) * bs, b):
            total += phase[(-(s + j)) % bs]
        return total

    def state_at(self, t: float) -> tuple[int, int, int, int, int, int, int, int]:
        kv_used, tokens, steps = self.kv.used, self.tokens, self.step_clock
        if self.busy and self.run_decode:
            m = self._steps_before(t, sampling=True)
            started = min(m + 1, self.run_k)
            kv_used += self._allocs(self.run_alloc, started)
            tokens += (m - self.run_done) * self.decode_batch
            steps += m - self.run_done
        return (
            len(self.running),
            self.waiting.size(),
            kv_used,
            tokens,
            steps,
            self.hit_tokens,
            self.preemptions,
            self.finished,
        )

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
        b = self.decode_batch
        if self.run_lazy:
            self._log(b, self.run_ctx0 + self.run_done * b, n, b)
        else:
            self.pending_literal.extend(
                self.run_durs[self.run_done : m]
            )  # array to array: a copy, not a per-item parse
            self._log(-1, 0, n, b)
        self.step_clock += n
        self.ctx_sum += n * b
        self.outstanding -= n * b
        self.tokens += n * b
        self.run_done = m

    def _join_decode(self, req: Req) -> None:
        S = self.step_clock
        req.decoding = True
        req.joined_at_step, req.generated_at_join, req.computed_at_join = S, req.generated, req.n_comp
        req.last_step = S + (req.osl - req.generated) - 1
        self.decode_batch += 1
        self.ctx_sum += req.n_comp + 1
        self.phase[(req.n_comp - S) % self.bs] += 1
        heappush(self.fin_heap, (req.last_step, req.stamp, req.ver, req))

    def _leave_decode(self, req: Req, S: int) -> None:
        """Materialise a decode's progress at step clock S and take it out of the decoding set."""
        n = S - req.joined_at_step
        req.generated = req.generated_at_join + n
        req.n_comp = req.computed_at_join + n
        req.alloc = req.n_comp
        req.decoding = False
        req.ver += 1
        if n > 0:
            req.decode_spans.append((req.joined_at_step, S))
        self.decode_batch -= 1
        self.ctx_sum -= req.n_comp + 1
        self.phase[(req.computed_at_join - req.joined_at_step) % self.bs] -= 1

    def _finish_decodes(self, t: float) -> None:
        heap, last = self.fin_heap, self.step_clock - 1
        while heap and heap[0][0] <= last:
            _, _, ver, req = heappop(heap)
            if ver != req.ver:
                continue
            self._leave_decode(req, self.step_clock)
            req.last_tok = t
            self._complete(req, t)

    def _generated_now(self, req: Req) -> int:
        """Tokens `req` has generated by the step clock (a decoding request's count is kept lazily)."""
        return req.generated_at_join + self.step_clock - req.joined_at_step if req.decoding else req.generated

    def _outputs_left(self) -> int:
        """Σ min(output left, CLIP_NEW_TOKENS) over the running requests (an admission policy's estimate)."""
        return sum(min(r.cap - self._generated_now(r), CLIP_NEW_TOKENS) for r in self.running.values())

    def _plan_run(self, t: float, single: bool) -> None:
        S, B, bs = self.step_clock, self.decode_batch, self.bs
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
            free = self.kv.plain if self.waiting.size() else self.kv.free
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
        if (
            k > 1 and self.waiting.size() and self.admission.tracks_progress and len(self.running) < self.max_seqs
        ):  # its estimate shrinks every step
            head = self.waiting.peek()
            view = self.admission_view
            view.new_tokens = (
                min(head.cap - head.generated, CLIP_NEW_TOKENS) + bs
            )  # its new tokens with its whole prompt cached
            view.lifetime_blocks = lifetime_blocks(head.isl, head.cap, bs)
            view.num_blocks, view.free_tokens, view.running_remaining, view.step = (
                self.kv.num_blocks,
                self.kv.free * bs,
                self._outputs_left(),
                S,
            )
            k = self.admission.steps_before_admissible(view, k, B)
        d_max = 0
        if not self.timer.linear:
            d_max = max(r.computed_at_join + (S - r.joined_at_step) + 1 for r in self.running.values() if r.decoding)
        if self.timer.on_demand(B):
            self.run_lazy = True
            self.run_t0, self.run_ctx0, self.cursor_step, self.cursor_start = t, self.ctx_sum, 0, t
            self.sample_step, self.sample_start = 0, t
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
