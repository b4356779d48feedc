"""What the sizer's whole-deployment checks replay (`CheckedTraffic`): the whole trace, or for a trace longer than
`size.whole_trace_max_requests` its busiest span of that many consecutive requests.

A whole-deployment simulation costs time in proportion to the requests it replays, and the scenario fit, the router
comparison and the count range run dozens of them. The span replayed instead is the trace's busiest period: of the
spans of that many requests arriving at most `MAX_DENSITY` times the trace's mean rate, the one whose arrivals ask
the most work per second (prompt + output tokens ÷ its arrival span). The density cap keeps it a period of the
trace, with its bursts and the calm between them, rather than a cluster of bursts packed end to end, which no
stretch of the real traffic sustains (at a 99% target it would size for bursts alone; its queues would not even
drain inside it). It is replayed on the planning clock of the whole trace (`rate_factor`: its own mean rate ÷ the
trace's), so the plan is checked at the planning rate's peak period, as capacity is planned for the peak hour; the
report names the span.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from llmcap.trace.synth import mean_rate


@dataclass(frozen=True)
class CheckedTraffic:
    """The requests the whole-deployment checks replay, and where they sit in the trace."""

    trace: pa.Table
    rate_factor: float  # their mean arrival rate ÷ the whole trace's (1: the whole trace)
    first: int  # index of the first request in the trace
    total: int  # requests in the whole trace

    @property
    def whole(self) -> bool:
        return self.trace.num_rows == self.total

    def describe(self) -> str:
        if self.whole:
            return f"the whole trace ({self.total:,} requests)"
        n = self.trace.num_rows
        return (
            f"the busiest span of the trace: requests {self.first + 1:,}–{self.first + n:,} of {self.total:,} "
            f"(most prompt + output tokens per second; arriving {self.rate_factor:.2f}× the trace's mean rate), "
            "not the whole trace (size.whole_trace_max_requests)"
        )


MAX_DENSITY = 2.0  # the span arrives at most this many times faster than the whole trace (module docstring)


def checked_traffic(trace: pa.Table, max_requests: int) -> CheckedTraffic:
    """`trace` itself when it holds at most `max_requests` requests (0: no limit), else its busiest span of
    `max_requests` consecutive requests (module docstring; ties: the earliest)."""
    n = trace.num_rows
    if max_requests <= 0 or n <= max_requests:
        return CheckedTraffic(trace, 1.0, 0, n)
    arrival = trace.column("arrival_s").to_numpy().astype(np.float64)
    tokens = trace.column("isl").to_numpy().astype(np.float64) + trace.column("osl").to_numpy().astype(np.float64)
    work = np.concatenate(([0.0], np.cumsum(tokens)))
    starts = np.arange(n - max_requests + 1)
    span_s = arrival[starts + max_requests - 1] - arrival[starts]
    # a period, not a cluster of bursts: at most MAX_DENSITY × the mean rate (spans sharing their ends cover every gap
    # of the trace, so the longest lasts at least half the time its M-1 gaps take at the mean rate: one always
    # qualifies); a span of one instant (quantised timestamps) never does
    period = (span_s > 0) & (span_s * MAX_DENSITY * mean_rate(trace) >= max_requests - 1)
    per_s = np.where(period, (work[starts + max_requests] - work[starts]) / np.where(period, span_s, 1.0), -1.0)
    first = int(np.argmax(per_s))
    span = trace.slice(first, max_requests)
    return CheckedTraffic(span, mean_rate(span) / mean_rate(trace), first, n)
