"""What one run of a profiling cell measured, and a cell's runs aggregated (llmcap.live.profiler runs them).

From each run:
- TTFT: at concurrency 1 from `ttft_probes` extra requests alone with max_tokens 1 per repeat
  (client overhead + the prefill of ISL tokens; nothing after the first token can hold it back);
  at higher concurrency the median TTFT of the burst (queueing included, not used in the fit);
- the *steady window*: from the last first token to the first finish, when all `concurrency`
  sequences decode together; every step inside it is one decode step of that batch at the
  sequences' current contexts (ISL + tokens so far). Measured on vLLM CPU: the server now and
  then holds a stream back and releases it in a burst; `Run.steady` is robust to that.
Cells aggregate runs by median (the machine is shared: medians, not means, across runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from llmcap.live.client import StreamResult


@dataclass
class Run:
    isl: int
    concurrency: int
    repeat: int
    results: list[StreamResult]
    preemptions: float | None = None
    server_itl_s: float | None = None  # mean gap by the engine's own timestamps (/metrics), all gaps of the run

    @property
    def ok(self) -> bool:
        return all(r.status == "ok" and r.tokens > 0 for r in self.results)

    def window(self) -> tuple[float, float] | None:
        """(start, end) of the steady window: the last first token to the first finish. A stream whose
        first tokens came in a burst was held back by the server: its first token was made earlier
        than it arrived, so it does not push the start later (unless every stream was held)."""
        if any(r.first_token_s is None for r in self.results):
            return None
        # every result has a chunk now, so its first_token_s and finish_s are floats
        prompt = [cast(float, r.first_token_s) for r in self.results if not _held_start(r)]
        start = max(prompt or [cast(float, r.first_token_s) for r in self.results])
        end = min(cast(float, r.finish_s) for r in self.results)
        return (start, end) if end > start else None

    def steady(self) -> list[tuple[float, float, float]]:
        """Per request, (step time, mean context, steps) over the steady window: from the last
        first token to the first finish, when all sequences decode together.

        A request's step time there is the median over blocks of 8 steps of (time span) / (steps),
        not a mean of client gaps: a server that briefly holds its stream (measured on vLLM CPU:
        ~100 ms now and then) delivers the held tokens in a burst, which would fake near-zero gaps,
        and other load on the machine stalls single steps. A burst at the window's start is
        skipped (those tokens were made before it); later ones stay inside their block.
        """
        window = self.window()
        if window is None:
            return []
        start, end = window
        out = []
        for r in self.results:
            t = _spread(r)
            j = np.flatnonzero((t >= start) & (t <= end))
            if j.size < 3:
                continue
            gaps = np.diff(t[j])
            typical = np.median(gaps)
            if typical < 0.1 * (cast(float, r.finish_s) - r.sent_s) / r.tokens:  # a window: every result has a chunk
                continue  # held and released at once: the client saw no steps at all
            lead = int(np.argmax(gaps >= 0.1 * typical)) if typical > 0 else 0  # leading burst
            j = j[lead + 1 if lead else 0 :]  # the gap closing a burst is partial too: start after it
            if j.size < 3 or t[j[-1]] <= t[j[0]]:
                continue
            steps = float(j[-1] - j[0])
            # gap k (token k -> k+1, 0-based k) is a decode step over isl + k + 1 tokens
            out.append((_block_median_step(t[j]), r.isl + float(np.mean(j[:-1])) + 1.0, steps))
        return out

    def gaps(self) -> np.ndarray:
        """Every client-seen gap inside the steady window (for the ITL percentiles)."""
        window = self.window()
        if window is None:
            return np.empty(0)
        start, end = window
        out = []
        for r in self.results:
            t = _spread(r)
            keep = (t[:-1] >= start) & (t[1:] <= end)
            out.append(np.diff(t)[keep])
        return np.concatenate(out) if out else np.empty(0)


def _block_median_step(t: np.ndarray, block: int = 8) -> float:
    """Seconds per step of consecutive token times `t`: the median over blocks of `block` steps of
    each block's span / steps. A stall (the machine is shared) or a held-then-released burst
    stays inside one block, whose rate the median ignores; within a block they cancel out."""
    n = t.size - 1
    if n < 2 * block:
        return float((t[-1] - t[0]) / n)
    edges = np.arange(0, n - block // 2, block)  # drop a last block shorter than half a block
    ends = np.minimum(edges + block, n)
    return float(np.median((t[ends] - t[edges]) / (ends - edges)))


def _held_start(r: StreamResult) -> bool:
    """The stream's first tokens arrived together (gaps under a tenth of its typical gap)."""
    t = _spread(r)
    if t.size < 4:
        return False
    g = np.diff(t)
    typical = np.median(g)
    return bool(typical > 0 and g[0] < 0.1 * typical and g[1] < 0.1 * typical)


def _spread(r: StreamResult) -> np.ndarray:
    """Per-token times; tokens that came in one chunk are spread evenly over the gap before it
    (the chunk means the client lagged; the engine made them one step apart)."""
    t = np.asarray(r.chunk_s, dtype=np.float64)
    k = np.asarray(r.chunk_tokens, dtype=np.int64)
    out: list[float] = []
    for i in range(t.size):
        prev = t[i - 1] if i else t[i]
        out.extend(prev + (t[i] - prev) * (np.arange(1, k[i] + 1) / k[i]) if i else [t[i]] * int(k[i]))
    return np.asarray(out, dtype=np.float64)


@dataclass(frozen=True)
class Cell:
    """A cell's runs, aggregated (seconds)."""

    isl: int
    osl: int
    concurrency: int
    repeats: int
    requests: int
    ttft_s: float | None  # median over runs of the run's median TTFT
    ttft_p90_s: float | None
    itl_mean_s: float | None  # median over runs of the run's steady decode step (see itl_source)
    itl_source: str | None  # "client": the SSE stream's steady window; "server": /metrics (stream held back)
    itl_server_mean_s: float | None  # median over runs of the engine's own mean gap (/metrics), all gaps
    itl_p50_s: float | None
    itl_p90_s: float | None
    itl_p99_s: float | None
    itl_max_s: float | None
    steady_gaps: int
    decode_context_mean: float | None
    tpot_mean_s: float | None
    preemptions: int | None


def _q(a: np.ndarray, p: float) -> float | None:
    return float(np.percentile(a, p)) if a.size else None


def aggregate(runs: list[Run], osl: int, ttft_probes: list[float]) -> Cell:
    ok = [r for r in runs if r.ok]
    steady = [r.steady() for r in ok]
    # a run's step time: median over its requests; the cell's: median over runs
    run_steps = [float(np.median([s for s, _, _ in st])) for st in steady if st]
    run_ctx = [float(np.median([c for _, c, _ in st])) for st in steady if st]
    pooled = np.concatenate([r.gaps() for r in ok]) if ok else np.empty(0)
    ttft = np.array(ttft_probes if ttft_probes else [x.ttft_s for r in ok for x in r.results], dtype=np.float64)
    tpots = [
        (cast(float, x.finish_s) - cast(float, x.first_token_s)) / (x.tokens - 1)
        for r in ok
        for x in r.results
        if x.tokens > 1
    ]  # ok results streamed their tokens: chunk_s is non-empty
    pre = [r.preemptions for r in runs if r.preemptions is not None]
    server = [r.server_itl_s for r in ok if r.server_itl_s]
    server_itl = float(np.median(server)) if server else None
    first = runs[0]
    # The client's view is primary; when the server held every stream back (vLLM CPU did so for its
    # fastest steps: ISL 64 x 4, ~2.5 ms) the engine's own timestamps are the only view of its steps.
    itl, source = (
        (float(np.median(run_steps)), "client") if run_steps else (server_itl, "server" if server_itl else None)
    )
    ctx_mean = float(np.median(run_ctx)) if run_ctx else (first.isl + osl / 2.0 if server_itl else None)
    return Cell(
        isl=first.isl,
        osl=osl,
        concurrency=first.concurrency,
        repeats=len(ok),
        requests=sum(len(r.results) for r in ok),
        ttft_s=float(np.median(ttft)) if ttft.size else None,
        ttft_p90_s=_q(ttft, 90),
        itl_mean_s=itl,
        itl_source=source,
        itl_server_mean_s=server_itl,
        itl_p50_s=_q(pooled, 50),
        itl_p90_s=_q(pooled, 90),
        itl_p99_s=_q(pooled, 99),
        itl_max_s=float(pooled.max()) if pooled.size else None,
        steady_gaps=int(pooled.size),
        decode_context_mean=ctx_mean,
        tpot_mean_s=float(np.mean(tpots)) if tpots else None,
        preemptions=int(sum(pre)) if pre else None,
    )
