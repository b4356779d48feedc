"""SLO attainment and goodput over per-request records (`llmcap.sim.records.REQUEST_SCHEMA`).

Definitions (docs/domain.md):
- A request *qualifies* only if its status is "ok" and it meets EVERY per-request target that is set:
  TTFT, ITL (at the chosen per-request statistic: median, P99 or worst gap, or mean = TPOT), TPOT, E2E,
  queue time.
- A token-level ITL target (`itl_stat: token_pNN`) is no per-request target: the NN-th percentile of every
  inter-token gap of every request of the run must meet it (`token_itl_check`), as `vllm bench serve`
  reports ITL. A run that misses it fails whatever its attainment. Unfinished or rejected
  requests never qualify. A request with one output token has no gaps: its ITL/TPOT targets hold
  vacuously (the columns are null by the schema); a missing TTFT/E2E/queue time on an "ok" row fails.
- The *measurement window* is over arrival times. With t0 / t1 the first / last arrival, span = t1 − t0,
  warm-up w = max(warmup_s, warmup_frac × span) and drain d = max(drain_s, drain_frac × span), the steady
  window is [t0 + w, t1 − d) when d > 0 and [t0 + w, t1] when d = 0 (so no drain keeps the last arrival).
  Requests are counted by arrival, whatever happens to them later (a request that arrived in the window
  and never finished counts as a failure).
- Attainment A = qualified / requests, both over arrivals in the window.
- Goodput = qualified requests in the window ÷ window length (req/s), and per GPU when a GPU count is given.
- Distribution-level checks (e.g. P99 TTFT across requests ≤ target) are reported separately; unfinished
  or rejected requests enter them as +inf (they never got the token), one-token requests drop out of
  ITL/TPOT percentiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from llmcap.errors import LlmcapError
from llmcap.sim.metrics import weighted_quantiles
from llmcap.sizing.params import DistMetric, ItlStat, SloParams

_MS = 1e-3

# SloParams field -> records column it bounds (ITL's column depends on itl_stat).
_TARGET_COLUMNS = {"ttft_ms": "ttft_s", "tpot_ms": "tpot_s", "e2e_ms": "e2e_s", "max_queue_ms": "queue_s"}
_NULL_PASSES = {"tpot_s", "itl_p50_s", "itl_p99_s", "itl_max_s"}  # null only for osl = 1: no gaps to violate
_DIST_COLUMNS: dict[DistMetric, str] = {
    "ttft": "ttft_s",
    "tpot": "tpot_s",
    "e2e": "e2e_s",
    "queue": "queue_s",
    "itl_p50": "itl_p50_s",
    "itl_p99": "itl_p99_s",
    "itl_max": "itl_max_s",
}


def _col(records: pa.Table, name: str) -> NDArray[np.float64]:
    """A float column with nulls as NaN."""
    return records.column(name).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


def _ok(records: pa.Table) -> NDArray[np.bool_]:
    return np.asarray(records.column("status").to_numpy(zero_copy_only=False) == "ok", dtype=bool)


def itl_column(stat: ItlStat) -> str | None:
    """The records column a per-request ITL statistic bounds (the mean gap is TPOT); None for token-level."""
    if stat.startswith("token_"):
        return None
    return "tpot_s" if stat == "mean" else f"itl_{stat}_s"


_ITL_NAMES = {
    "p50": "ITL (per-request median gap)",
    "p99": "ITL (per-request p99 gap)",
    "max": "ITL (per-request worst gap)",
    "mean": "TPOT (per-request mean gap)",
}


def itl_name(stat: ItlStat) -> str:
    """The ITL statistic in the words every report uses for it, so "ITL" never names two statistics."""
    q = token_percentile(stat)
    return f"ITL (token-level p{q:g} of all gaps)" if q is not None else _ITL_NAMES[stat]


def token_percentile(stat: ItlStat) -> float | None:
    """The percentile of a token-level ITL statistic (token_p99 → 99.0); None for per-request ones."""
    return float(stat.removeprefix("token_p")) if stat.startswith("token_") else None


def targets(slo: SloParams) -> dict[str, float]:
    """records column -> upper bound in seconds, for every per-request target that is set (TTFT: the
    length-independent part; see `bounds` for the per-request values)."""
    out = {col: getattr(slo, f) * _MS for f, col in _TARGET_COLUMNS.items() if getattr(slo, f) is not None}
    col = itl_column(slo.itl_stat)
    if slo.itl_ms is not None and col is not None:
        out[col] = min(out.get(col, math.inf), slo.itl_ms * _MS)  # itl_stat mean and tpot_ms bound one column
    return out


def bounds(records: pa.Table, slo: SloParams) -> dict[str, float | NDArray[np.float64]]:
    """records column -> each request's upper bound in seconds (TTFT grows with ISL when so configured)."""
    out: dict[str, float | NDArray[np.float64]] = dict(targets(slo))
    if "ttft_s" in out and slo.ttft_ms_per_1k_isl > 0:
        out["ttft_s"] = out["ttft_s"] + slo.ttft_ms_per_1k_isl * _MS * _col(records, "isl") / 1000.0
    return out


def misses(records: pa.Table, slo: SloParams) -> dict[str, NDArray[np.bool_]]:
    """Per target column, which requests miss it ("status" = not ok). One request may miss several. Records
    carrying the trace's `deadline_s` (`with_deadlines`) also miss where E2E exceeds their own deadline."""
    ok = _ok(records)
    out: dict[str, NDArray[np.bool_]] = {"status": ~ok}
    for col, bound in bounds(records, slo).items():
        v = _col(records, col)
        null = np.isnan(v)
        passed = (v <= bound) | (null & (col in _NULL_PASSES))
        out[col] = ok & ~passed  # a non-ok request is already counted under "status"
    if "deadline_s" in records.column_names:
        deadline = _col(records, "deadline_s")
        out["deadline_s"] = (
            ok & ~np.isnan(deadline) & ~(_col(records, "e2e_s") <= deadline)
        )  # a request without one has none to miss
    return out


def deadlines(trace: pa.Table) -> int:
    """How many of the trace's requests carry their own end-to-end deadline (`deadline_s`)."""
    return trace.num_rows - trace.column("deadline_s").null_count if "deadline_s" in trace.column_names else 0


def with_deadlines(records: pa.Table, trace: pa.Table) -> pa.Table:
    """`records` with each request's `deadline_s` from `trace` (matched by request_id), so `misses` judges it; unchanged
    when no request of the trace has a deadline."""
    if not deadlines(trace):
        return records
    ids = trace.column("request_id").to_numpy()
    order = np.argsort(ids, kind="stable")
    at = np.searchsorted(ids[order], records.column("request_id").to_numpy())
    deadline = trace.column("deadline_s").to_numpy(zero_copy_only=False).astype(np.float64)[order][at]
    return records.append_column("deadline_s", pa.array(deadline, pa.float64(), from_pandas=True))


def qualifies(records: pa.Table, slo: SloParams) -> NDArray[np.bool_]:
    """True where the request is "ok" and meets every configured per-request target."""
    m = misses(records, slo)
    bad = np.zeros(records.num_rows, dtype=bool)
    for v in m.values():
        bad |= v
    return ~bad


@dataclass(frozen=True)
class Window:
    """Arrival-time window [start_s, end_s), or [start_s, end_s] when closed_end."""

    start_s: float
    end_s: float
    closed_end: bool = False

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s

    def mask(self, arrival_s: NDArray[np.float64]) -> NDArray[np.bool_]:
        hi = arrival_s <= self.end_s if self.closed_end else arrival_s < self.end_s
        return (arrival_s >= self.start_s) & hi


def steady_window(
    arrival_s: NDArray[np.float64],
    warmup_s: float = 0.0,
    drain_s: float = 0.0,
    warmup_frac: float = 0.0,
    drain_frac: float = 0.0,
) -> Window:
    """The steady window of an arrival span (module docstring); LlmcapError when it is empty."""
    a = np.asarray(arrival_s, dtype=np.float64)
    if a.size == 0:
        raise LlmcapError("no requests: cannot form a measurement window")
    t0, t1 = float(a.min()), float(a.max())
    span = t1 - t0
    w = max(warmup_s, warmup_frac * span)
    d = max(drain_s, drain_frac * span)
    win = Window(t0 + w, t1 - d, closed_end=d == 0)
    if win.end_s < win.start_s or (win.end_s == win.start_s and not win.closed_end):
        raise LlmcapError(f"warm-up {w:g} s + drain {d:g} s leave nothing of the {span:g} s arrival span")
    return win


def window_for(records: pa.Table, slo: SloParams) -> Window:
    """The steady window `slo`'s warm-up and drain give for these records."""
    return steady_window(_col(records, "arrival_s"), slo.warmup_s, slo.drain_s, slo.warmup_frac, slo.drain_frac)


@dataclass(frozen=True)
class Goodput:
    requests: int  # arrivals in the window
    qualified: int
    attainment: float
    window: Window
    goodput_rps: float  # qualified / window length
    goodput_per_gpu: float | None
    offered_rps: float  # arrivals / window length
    misses: dict[str, int]  # per target column (and "status"): requests in the window that miss it


def _in_window(records: pa.Table, slo: SloParams, window: Window | None) -> tuple[NDArray[np.bool_], Window]:
    win = window or window_for(records, slo)
    m = win.mask(_col(records, "arrival_s"))
    if not m.any():
        raise LlmcapError(f"no arrivals in the measurement window [{win.start_s:g}, {win.end_s:g}]")
    return m, win


def attainment(records: pa.Table, slo: SloParams, window: Window | None = None) -> float:
    """Share of requests arriving in `window` (default: the SLO's steady window) that qualify."""
    m, _ = _in_window(records, slo, window)
    return float(qualifies(records, slo)[m].mean())


def goodput(records: pa.Table, slo: SloParams, window: Window | None = None, gpus: int | None = None) -> Goodput:
    """Qualified requests per second over the window (and per GPU with `gpus`)."""
    m, win = _in_window(records, slo, window)
    q = qualifies(records, slo)[m]
    n, k = int(m.sum()), int(q.sum())
    length = win.length_s
    # A zero-length closed window (all arrivals at one instant) has no rate.
    rate = k / length if length > 0 else math.inf
    return Goodput(
        requests=n,
        qualified=k,
        attainment=k / n,
        window=win,
        goodput_rps=rate,
        goodput_per_gpu=None if gpus is None else rate / gpus,
        offered_rps=n / length if length > 0 else math.inf,
        misses={c: int(v[m].sum()) for c, v in misses(records, slo).items()},
    )


def percentile_with_inf(values: NDArray[np.float64], q: float) -> float:
    """numpy's linear-interpolation percentile, where +inf entries stay +inf (np.percentile gives NaN)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    if v.size == 0:
        return math.nan
    rank = q / 100.0 * (v.size - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    frac = rank - lo
    if math.isinf(v[hi]) and frac > 0 or math.isinf(v[lo]):
        return math.inf
    return float(v[lo] + (v[hi] - v[lo]) * frac)


@dataclass(frozen=True)
class DistributionCheck:
    metric: str
    percentile: float
    target_ms: float
    observed_ms: float  # inf when the percentile falls on unfinished requests; nan when no values
    ok: bool
    requests: int  # values the percentile was taken over

    def miss_line(self) -> str:
        name = "ITL token-level" if self.metric.startswith("itl_token_") else _DIST_NAMES.get(self.metric, self.metric)
        return f"{name} P{self.percentile:g} {self.observed_ms:.4g} ms > {self.target_ms:g} ms"


_DIST_NAMES = {
    "ttft": "TTFT",
    "tpot": "TPOT",
    "e2e": "E2E",
    "queue": "queue time",
    "itl_p50": "per-request ITL p50",
    "itl_p99": "per-request ITL p99",
    "itl_max": "per-request worst gap",
}


def distribution_checks(records: pa.Table, slo: SloParams, window: Window | None = None) -> list[DistributionCheck]:
    """Each `slo.distribution` target against the percentile across requests in the window."""
    m, _ = _in_window(records, slo, window)
    ok = _ok(records)
    out = []
    for t in slo.distribution:
        col = _DIST_COLUMNS[t.metric]
        v = np.where(ok, _col(records, col), np.inf)[m]
        v = v[~np.isnan(v)]  # one-token requests have no ITL/TPOT
        obs = percentile_with_inf(v, t.percentile) / _MS
        out.append(
            DistributionCheck(t.metric, t.percentile, t.target_ms, obs, not obs > t.target_ms, int(v.size))
        )  # no values: nothing to miss
    return out


def token_itl_check(
    itl_values: NDArray[np.float64], itl_weights: NDArray[np.int64], slo: SloParams
) -> DistributionCheck | None:
    """The token-level ITL target (`itl_stat: token_pNN`) against a run's gaps as (value, tokens) pairs
    (`SimResult.itl_values` / `itl_weights`): the smallest gap whose cumulative share of tokens reaches NN%
    (inverted CDF). None when no token-level target is set; a run without gaps passes (nothing to violate)."""
    q = token_percentile(slo.itl_stat)
    if q is None or slo.itl_ms is None:
        return None
    tokens = int(np.sum(itl_weights))
    observed = weighted_quantiles(itl_values, itl_weights, [q / 100.0])[0] / _MS if tokens else math.nan
    return DistributionCheck(f"itl_token_p{q:g}", q, slo.itl_ms, observed, not observed > slo.itl_ms, tokens)


def definitions(slo: SloParams, disaggregated: bool, with_deadline: int = 0) -> dict[str, str]:
    """Each target that is set, in words: which definition the plan was judged by (report and summary.json);
    `with_deadline`: how many of the trace's requests carry their own deadline."""
    out: dict[str, str] = {}
    if slo.ttft_ms is not None:
        per_1k = f" + {slo.ttft_ms_per_1k_isl:g} ms per 1,000 prompt tokens" if slo.ttft_ms_per_1k_isl > 0 else ""
        seen = "arrival → first token"
        if disaggregated:
            seen += (
                " emitted by the decode instance after the P→D KV handoff (the first token the user sees)"
                if slo.ttft_includes_handoff
                else " computed by the prefill instance (the P→D handoff not included)"
            )
        out["ttft"] = f"≤ {slo.ttft_ms:g} ms{per_1k}, per request, {seen}"
    if slo.itl_ms is not None:
        q = token_percentile(slo.itl_stat)
        if q is not None:
            what = f"token-level P{q:g} of every inter-token gap of every request of the run (as vllm bench serve reports ITL)"
        else:
            what = {
                "p50": "per request, the median of its inter-token gaps",
                "p99": "per request, the P99 of its inter-token gaps",
                "max": "per request, its worst inter-token gap",
                "mean": "per request, its mean inter-token gap (TPOT: (last token − first token) / (OSL − 1))",
            }[slo.itl_stat]
        out["itl"] = f"≤ {slo.itl_ms:g} ms, {what} (itl_stat {slo.itl_stat})"
    if slo.tpot_ms is not None:
        out["tpot"] = f"≤ {slo.tpot_ms:g} ms, per request, (last token − first token) / (OSL − 1) (vLLM's tpot)"
    if slo.e2e_ms is not None:
        out["e2el"] = f"≤ {slo.e2e_ms:g} ms, per request, arrival → last token"
    if slo.max_queue_ms is not None:
        out["queue"] = f"≤ {slo.max_queue_ms:g} ms, per request, arrival → first scheduled"
    if with_deadline:
        out["deadline"] = (
            f"≤ the request's own deadline_s from the trace, per request, arrival → last token ({with_deadline:,} requests carry one)"
        )
    for t in slo.distribution:
        out[f"{t.metric}_p{t.percentile:g}"] = (
            f"≤ {t.target_ms:g} ms: P{t.percentile:g} of {_DIST_NAMES[t.metric]} across the steady "
            "window's requests, per run (a run that misses it fails whatever its attainment)"
        )
    out["attainment"] = (
        f"≥ {slo.attainment_target:g}: the share of the steady window's requests meeting every per-request target"
    )
    if slo.availability is not None:
        out["availability"] = (
            f"≥ {slo.availability:g}: the share of requests meeting every per-request target over the long run, with "
            "nodes failing and being repaired (headroom.node_mtbf_h, node_repair_h): every instance serving and each "
            "pool with its fullest node down, weighted by the time each lasts"
        )
    return out


def run_checks(
    records: pa.Table, itl_values: NDArray[np.float64], itl_weights: NDArray[np.int64], slo: SloParams
) -> list[DistributionCheck]:
    """Every target judged on the run as a whole rather than per request: the token-level ITL (over all its
    gaps) and each `distribution` target (across the steady window's requests). A run meets its SLO only
    if its attainment does and every one of these passes."""
    token = token_itl_check(itl_values, itl_weights, slo)
    return ([token] if token is not None else []) + distribution_checks(records, slo)


def run_miss(checks: list[DistributionCheck]) -> str:
    """What the run missed of its run-level targets, "" when nothing."""
    return "; ".join(c.miss_line() for c in checks if not c.ok)
