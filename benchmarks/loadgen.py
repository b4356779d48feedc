"""`make bench` (load generator part): how well `llmcap.live.trace_replay` keeps its schedule.

Against the minimal loopback server (`llmcap.live.loopback`, its own process, 127.0.0.1; 4 output
tokens 1 ms apart per request), requests evenly spaced, 16 prompt tokens each, `SECONDS` s of sending
per run, the best of `REPEATS` runs per rate: send lateness (actual send − scheduled) p50 / p99 / max
at 100, 300 and 500 req/s, then the highest rate of a doubling-then-bisecting search whose lateness
p99 stays within `BOUND_MS` — the generator's own capacity on this machine (client and server share
its cores). Every run also prints the processes the replay used (its default: `processes_for`), the
client's CPU per request and the statuses (every request must be ok).
`python -m benchmarks.loadgen` runs this part alone.
"""

from __future__ import annotations

import asyncio

import numpy as np

from llmcap.live.loopback import serving_loopback
from llmcap.live.trace_replay import ReplayResult, replay_async

BOUND_MS = 5.0
SECONDS = 4.0
RATES = (100, 300, 500)
MAX_RATE = 8000  # the search stops here (bounded in time)
REPEATS = 3  # runs per rate; the one with the lowest p99 is kept: other sessions' load only ever adds lateness


def run_at(url: str, rate: float, seconds: float = SECONDS) -> ReplayResult:
    """The best (lowest lateness p99) of REPEATS runs at `rate`."""
    n = int(rate * seconds)
    arrival = np.arange(n) / rate
    runs = [
        asyncio.run(replay_async(url, "loopback", arrival, np.full(n, 16), np.full(n, 4), timeout_s=30.0))
        for _ in range(REPEATS)
    ]
    return min(runs, key=lambda r: float(np.percentile(r.lateness_s, 99)))


def _line(rate: float, r: ReplayResult) -> tuple[str, float]:
    late = r.lateness_s * 1e3
    p50, p99, mx = np.percentile(late, 50), np.percentile(late, 99), late.max()
    status = r.requests.column("status").to_pylist()
    ok = status.count("ok")
    text = (
        f"{rate:>7,.0f} req/s: lateness p50 {p50:6.2f} ms, p99 {p99:7.2f} ms, max {mx:7.2f} ms; "
        f"{len(status):,} requests in {r.wall_s:.2f} s (scheduled {len(status) / rate:.2f} s), ok {ok:,}; "
        f"{r.processes} process(es), client CPU {r.client_cpu_s / len(status) * 1e6:,.0f} us/request"
    )
    return text, float(p99)


def max_rate_held(url: str, start: float) -> float:
    """Highest rate (req/s) whose lateness p99 ≤ BOUND_MS: double until it fails, then bisect 4 times."""
    held, failed, rate = 0.0, None, start
    while failed is None and rate <= MAX_RATE:
        text, p99 = _line(rate, run_at(url, rate))
        print("  search", text)
        held, failed = (rate, None) if p99 <= BOUND_MS else (held, rate)
        rate *= 2
    if failed is None:
        return held
    for _ in range(4):
        mid = (held + failed) / 2
        text, p99 = _line(mid, run_at(url, mid))
        print("  search", text)
        held, failed = (mid, failed) if p99 <= BOUND_MS else (held, mid)
    return held


def main() -> None:
    print(
        f"load generator vs a loopback SSE server ({SECONDS:.0f} s of evenly spaced requests per rate, 16 in / 4 out tokens)"
    )
    with serving_loopback() as url:
        for rate in RATES:
            print(_line(rate, run_at(url, rate))[0])
        held = max_rate_held(url, 500.0)
    print(f"max rate held with send lateness p99 <= {BOUND_MS:.0f} ms: {held:,.0f} req/s")


if __name__ == "__main__":
    main()
