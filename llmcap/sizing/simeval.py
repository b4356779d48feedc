"""The simulator as the search's `evaluate(rate, seed)`: replay a rate-scaled excerpt of the trace.

Each seed draws a different excerpt (a run of consecutive requests, so bursts and the joint ISL/OSL/
prefix structure stay as recorded), spreads requests that share a quantised timestamp over their tick
(`llmcap.trace.synth.spread_ties`, seeded) and scales its arrival clock so its mean rate is `rate`. The
simulated per-request records are scored with the SLOs over the steady window (warm-up and drain
excluded), and the metrics the capacity table shows are measured over the same window.

Excerpt length (rate-aware, `SteadyParams`): at rate λ the excerpt holds at least `excerpt_requests`
requests and spans at least max(span_ttft_multiple × T, span_drain_multiple × D) seconds of arrivals,
i.e. ⌈λ × span⌉ + 1 requests, where T is the TTFT target of the trace's mean-ISL request and D the drain
time (last finish − last arrival) of the run; a passing run shorter than its own drain rule is replayed
once at that length (a failing one is already judged). Never more than the whole trace. A fixed request count would shrink to a few seconds at high
rates, ending before a growing queue shows.

Stability (`llmcap.sizing.stability`): a run whose TTFT still grows across the steady window, or that
serves less than it is offered, is overloaded: the evaluation reports it and the search counts the rate
infeasible whatever its attainment.

`SimEvaluate` is a frozen dataclass of plain data (trace table, step model, engine knobs, SLOs), so
it pickles to process or Dask workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.errors import LlmcapError
from llmcap.perf.model import StepTimeModel
from llmcap.policy_names import DEFAULT_ROUTER
from llmcap.sim import EngineConfig, PDConfig, SimConfig, SimResult, simulate
from llmcap.sizing.params import SloParams, SteadyParams
from llmcap.sizing.search import EvalResult
from llmcap.sizing.slo import attainment, misses, run_checks, run_miss, window_for, with_deadlines
from llmcap.sizing.stability import stability
from llmcap.trace.synth import scale_rate, spread_ties


def excerpt(trace: pa.Table, n: int, seed: int) -> pa.Table:
    """`n` consecutive requests from a seeded start (the whole trace when it is not longer than `n`)."""
    if trace.num_rows < 2:
        raise LlmcapError("the trace needs at least 2 requests to be rate-scaled")
    if trace.num_rows <= n:
        return trace
    start = int(np.random.default_rng(seed).integers(0, trace.num_rows - n + 1))
    return trace.slice(start, n)


def _steady(records: pa.Table, slo: SloParams) -> np.ndarray:
    return window_for(records, slo).mask(records.column("arrival_s").to_numpy())


def _col(records: pa.Table, name: str, mask: np.ndarray) -> np.ndarray:
    x = records.column(name).to_numpy(zero_copy_only=False).astype(np.float64)[mask]
    return x[~np.isnan(x)]


def _pct_ms(x: np.ndarray, prefix: str) -> dict[str, float]:
    if x.size == 0:
        return {}
    p = np.percentile(x, [50, 90, 99]) * 1e3
    return {f"{prefix}_p{q}_ms": float(v) for q, v in zip((50, 90, 99), p, strict=True)}


def run_metrics(
    result: SimResult, slo: SloParams, kv_bytes_per_token: float, block_size: int, disaggregated: bool
) -> dict[str, float]:
    """The capacity table's metric columns (and `kv_tokens_p99` for memory headroom) of one simulation."""
    rec = result.records
    steady = _steady(rec, slo)
    ok = steady & (rec.column("status").to_numpy(zero_copy_only=False) == "ok")
    m: dict[str, float] = {}
    m |= _pct_ms(_col(rec, "ttft_s", ok), "ttft")
    m |= _pct_ms(_col(rec, "e2e_s", ok), "e2e")
    if result.itl_weights.sum() > 0:  # the summary's token-weighted quantiles (one sort of the distribution)
        itl = result.summary["itl_ms"]
        m |= {f"itl_p{p}_ms": float(itl[f"p{p}"]) for p in (50, 90, 99)}
    tput = result.summary["throughput"]["output_tok_s"]
    if tput is not None:
        m["tokens_per_s"] = float(tput)
    ts = result.timeseries
    if ts.num_rows:
        m["mean_active"] = float(np.mean(ts.column("running").to_numpy()))
        m["mean_waiting"] = float(np.mean(ts.column("waiting").to_numpy()))
        # KV is held by the decode pool in P/D (a prefill replica frees its blocks at the handoff)
        held = ts.filter(pc.equal(ts["role"], "decode")) if disaggregated else ts
        if held.num_rows:
            usage = held.column("kv_usage").to_numpy()
            m["kv_usage_p50"], m["kv_usage_p99"] = (float(v) for v in np.percentile(usage, [50, 99]))
            m["kv_tokens_p99"] = float(np.percentile(held.column("kv_used_blocks").to_numpy(), 99)) * block_size
            m["kv_p99_share"] = m["kv_usage_p99"]
    miss = misses(rec, slo)
    m["ttft_misses"] = float((miss["ttft_s"] & steady).sum()) if "ttft_s" in miss else 0.0
    m["itl_misses"] = float(sum((v & steady).sum() for k, v in miss.items() if k.startswith(("itl_", "tpot_"))))
    m["preemptions"] = float(result.summary["preemptions"])
    if disaggregated:  # the whole prompt's KV moves from the prefill to the decode replica
        m["network_payload_mb"] = float(np.mean(_col(rec, "isl", ok)) * kv_bytes_per_token / 1e6) if ok.any() else 0.0
        m |= handoff_metrics(result, ok)
    else:
        m["network_payload_mb"] = 0.0
    return m


def ok_rows(records: pa.Table) -> np.ndarray:
    """The records that finished ("ok"), as a mask."""
    return records.column("status").to_numpy(zero_copy_only=False) == "ok"


HANDOFF = (("handoff_post", None), ("handoff_transfer", "transfer_s"), ("visible_wait", "visible_wait_s"))
"""The P→D handoff's parts, capacity-table name → records column (post: `SimResult.handoff_post_s`)."""


def handoff_metrics(result: SimResult, rows: np.ndarray) -> dict[str, float]:
    """p50 and p99 (ms) of each P→D handoff part over `rows` (a mask of the records) that handed off: post
    (prefill done → KV on the link), transfer (on the link + latency), visible wait (prefill done → decode admission)."""
    m: dict[str, float] = {}
    rec = result.records
    for name, column in HANDOFF:
        if column is None:
            post = result.handoff_post_s
            x = np.empty(0) if post is None else post[rows]
            x = x[~np.isnan(x)]
        else:
            x = _col(rec, column, rows)
        if x.size:
            p50, p99 = np.percentile(x, [50, 99]) * 1e3
            m[f"{name}_ms_p50"], m[f"{name}_ms_p99"] = float(p50), float(p99)
    return m


@dataclass(frozen=True)
class SimEvaluate:
    """evaluate(rate, seed) -> EvalResult by simulating one deployment unit on a rate-scaled excerpt."""

    trace: pa.Table
    step_model: StepTimeModel
    engine: EngineConfig
    slo: SloParams
    excerpt_requests: int = 2000  # the fewest requests per excerpt (more at high rates: module docstring)
    replicas: int = 1
    router: str = DEFAULT_ROUTER
    pd: PDConfig | None = None
    decode_model: StepTimeModel | None = None  # P/D: the decode pool's, when its parallelism differs
    steady: SteadyParams = SteadyParams()
    rate_factor: float = 1.0  # `trace`'s mean rate ÷ the planning trace's (a busiest span: `llmcap.sizing.checked`)

    timeseries_bins: int = 500  # per-replica gauges: about this many bins over the excerpt's span

    def whole_trace(self) -> SimEvaluate:
        """The same evaluate replaying the whole trace at every rate and seed (seeds: tie spreading only)."""
        return replace(self, excerpt_requests=max(self.trace.num_rows, 2))

    def ttft_target_s(self) -> float | None:
        """The TTFT target of the trace's mean-ISL request (None: no TTFT target)."""
        if self.slo.ttft_ms is None:
            return None
        mean_isl = float(np.mean(self.trace.column("isl").to_numpy()))
        return (self.slo.ttft_ms + self.slo.ttft_ms_per_1k_isl * mean_isl / 1000.0) / 1e3

    def requests_at(self, rate: float, drain_s: float = 0.0) -> int:
        """Excerpt length at `rate` (module docstring), given the drain time of a run at that rate."""
        ttft = self.ttft_target_s() or 0.0
        span = max(self.steady.span_ttft_multiple * ttft, self.steady.span_drain_multiple * drain_s)
        n = max(self.excerpt_requests, math.ceil(rate * span) + 1)
        return min(n, self.trace.num_rows)

    def workload(self, rate: float, seed: int, requests: int | None = None) -> pa.Table:
        """What one run at `rate` replays: seed's excerpt of `requests` (default: `requests_at(rate)`) requests."""
        n = self.requests_at(rate) if requests is None else requests
        part = spread_ties(excerpt(self.trace, n, seed), np.random.default_rng(seed))
        return scale_rate(part, rate * self.rate_factor)

    def simulate(self, rate: float, seed: int, requests: int | None = None) -> SimResult:
        """One run at `rate` on `workload(rate, seed, requests)`."""
        part = self.workload(rate, seed, requests)
        arrival = part.column("arrival_s").to_numpy()
        # a fixed resolution would cost bins ∝ 1/rate at the low rates the search may probe
        resolution = max(1.0, float(arrival[-1] - arrival[0]) / self.timeseries_bins)
        config = SimConfig(
            engine=self.engine,
            replicas=self.replicas,
            router=self.router,
            pd=self.pd,
            timeseries_resolution_s=resolution,
        )
        return simulate(part, self.step_model, config, rng=np.random.default_rng(seed), decode_model=self.decode_model)

    def __call__(self, rate: float, seed: int) -> EvalResult:
        n = self.requests_at(rate)
        result = self.simulate(rate, seed, n)
        verdict = self._judge(result)
        longer = self.requests_at(rate, drain_time(result.records)) if n < self.trace.num_rows else n
        # Only a run that passes is replayed longer: one that already fails needs no more evidence (and an
        # overloaded run's drain time would ask for the whole trace).
        if longer > n and verdict.attainment >= self.slo.attainment_target and verdict.run_ok:
            result = self.simulate(rate, seed, longer)
            verdict = self._judge(result)
        return verdict

    def _judge(self, result: SimResult) -> EvalResult:
        rec = with_deadlines(result.records, self.trace)
        att = attainment(rec, self.slo)
        metrics = run_metrics(
            result, self.slo, self.engine.kv_bytes_per_token, self.engine.block_size, self.pd is not None
        )
        stab = stability(rec, window_for(rec, self.slo), self._trend_scale_s(rec), self.steady)
        metrics |= {"replayed_requests": float(rec.num_rows), "served_ratio": stab.served_ratio}
        if (
            "deadline_s" in rec.column_names
        ):  # the trace's own deadlines: how many the steady window missed (near misses name them)
            metrics["deadline_misses"] = float((misses(rec, self.slo)["deadline_s"] & _steady(rec, self.slo)).sum())
        checks = run_checks(rec, result.itl_values, result.itl_weights, self.slo)
        metrics |= {f"{c.metric}_ms": c.observed_ms for c in checks if c.metric.startswith("itl_token_")}
        return EvalResult(att, metrics, overload=stab.reason, run_miss=run_miss(checks))

    def _trend_scale_s(self, records: pa.Table) -> float:
        """What a TTFT rise is compared with: the TTFT target, else the E2E target, else the run's median E2E."""
        ttft = self.ttft_target_s()
        if ttft is not None:
            return ttft
        if self.slo.e2e_ms is not None:
            return self.slo.e2e_ms / 1e3
        e2e = _col(records, "e2e_s", _steady(records, self.slo))
        return float(np.median(e2e)) if e2e.size else math.inf


def drain_time(records: pa.Table) -> float:
    """Seconds from the last arrival to the last finish (0 when nothing finished after it)."""
    finish = records.column("finish_s").to_numpy(zero_copy_only=False).astype(np.float64)
    last_arrival = float(np.max(records.column("arrival_s").to_numpy()))
    last_finish = float(np.nanmax(finish)) if np.any(~np.isnan(finish)) else last_arrival
    return max(0.0, last_finish - last_arrival)
