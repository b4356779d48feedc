"""The step log of a replica and the per-request ITL statistics computed from it.

Steps reach the step log (durations and regular-gap weights, for the exact ITL distribution and the
per-request ITL stats) in bulk: `flush_log` writes the pending steps (a run of decode steps is one
entry, timed in one vectorised pass) every FLUSH_STEPS steps, then computes the ITL stats of the
requests that finished. In histogram mode the chunks no live request needs any more are folded into the
histogram and dropped (`_trim`).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right

import numpy as np

from llmcap.sim.histogram import itl_histogram
from llmcap.sim.request import Req
from llmcap.sim.state import ReplicaState

TRIM_STEPS = 1 << 16  # histogram mode: look for dead steps to drop once the log is this long (16 B a step)
FLUSH_STEPS = 1 << 13  # pending steps written to the log in one vectorised pass (see `flush_log`)
PARTITION_FROM = 256  # a request's gaps: sorted up to this many, partitioned beyond (numpy's sort is faster on few)


class StepLog(ReplicaState):
    """A replica's step log: what each step took and how many regular token gaps it ended."""

    def _log(self, b: int, ctx: int, n: int, w: int) -> None:
        """n more steps in the step log (see `pending_*`)."""
        self.pending_batch.append(b)
        self.pending_context.append(ctx)
        self.pending_count.append(n)
        self.pending_weight.append(w)
        self.pending_steps += n
        if self.pending_steps >= FLUSH_STEPS:
            self.flush_log()

    def flush_log(self) -> None:
        """Write the pending steps to the step log in one vectorised pass, then compute the ITL stats of the
        requests that finished since the last flush (the cluster calls it once more at the end)."""
        if self.pending_steps:
            n = np.array(self.pending_count, dtype=np.int64)
            b = np.array(self.pending_batch, dtype=np.int64)
            lit = np.frombuffer(self.pending_literal, dtype=np.float64)
            if lit.size == self.pending_steps:
                dur = lit.copy()
            else:
                # per-segment values repeated, no gathers: step s of segment k (from step first[k] on) has
                # context ctx[k] + (s - first[k])·b[k], an exact integer; literal segments are timed as
                # b = 0 and then overwritten (cheaper than timing the decode steps picked by a mask)
                first = np.cumsum(n) - n
                bt = np.maximum(b, 0)
                step_b = np.repeat(bt, n)
                ctx = np.repeat(np.array(self.pending_context, dtype=np.int64) - first * bt, n)
                ctx += np.arange(self.pending_steps) * step_b
                dur = self.timer.decode_durations(step_b, ctx.astype(np.float64))  # exact: below 2**53
                if lit.size:
                    dur[np.repeat(b < 0, n)] = lit
            self.chunk_at.append(self.log_base + self.log_n)
            self.chunk_d.append(dur)
            self.chunk_w.append(np.repeat(np.array(self.pending_weight, dtype=np.int64), n))
            self.log_n += dur.size
            del lit  # the view exports pending_literal's buffer: a new array, not a resized one
            self.pending_batch.clear()
            self.pending_context.clear()
            self.pending_count.clear()
            self.pending_weight.clear()
            self.pending_literal = array("d")
            self.pending_steps = 0
        due, self.stats_due = self.stats_due, []
        for req in due:
            self._itl_stats(req)
        if self.hist is not None and self.log_n > max(self.trim_at, TRIM_STEPS):
            self._trim()

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
        if req.osl <= 1 or not req.decode_spans:
            return
        extra = self.rec.extra_gaps
        a0, b0 = req.decode_spans[0]
        if len(req.decode_spans) == 1 and a0 >= 0:
            v = self._log_slice(a0, b0).copy()  # (methods, not np.sort: its Python wrapper costs more here)
        else:
            v = np.concatenate([self._log_slice(a, b) if a >= 0 else np.array([extra[b]]) for a, b in req.decode_spans])
        m = len(v)
        if m > PARTITION_FROM:  # only five order statistics are read: a partition finds them in linear time
            x50, x99 = 0.5 * (m - 1), 0.99 * (m - 1)
            v.partition([int(x50), math.ceil(x50), int(x99), math.ceil(x99), m - 1])
        else:
            v.sort()  # order statistics do not depend on the algorithm
        rec, i = self.rec, req.i
        for q, col in ((0.5, rec.itl_p50), (0.99, rec.itl_p99)):
            x = q * (m - 1)
            lo = int(x)  # floor and ceil of x >= 0
            hi = lo + 1 if x > lo else lo
            v_lo = float(v.item(lo))  # (.item: no numpy scalar in between)
            col[i] = v_lo + (float(v.item(hi)) - v_lo) * (x - lo)
        rec.itl_max[i] = float(v.item(m - 1))

    def _trim(self) -> None:
        """Histogram mode: fold the chunks of steps no live request still needs into `hist` and drop them."""
        live = [self.step_clock]
        for req in list(self.running.values()) + self.waiting.requests():
            if req.decoding:
                live.append(req.joined_at_step)
            live.extend(a for a, _ in req.decode_spans if a >= 0)
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
