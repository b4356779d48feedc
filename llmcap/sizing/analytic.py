"""Analytic sizing: demands of a workload, first replica counts, and upper bounds on a candidate's rate.

Everything here is closed-form and simulator-free. It gives (a) the initial guess the search starts
from, (b) upper bounds that prune hopeless candidates before any simulation, and (c) the numbers a
report uses to explain *why* a configuration needs what it needs (docs/domain.md, the four ledgers).

Units: rates in req/s, tokens, seconds, bytes. Workload inputs are per-request arrays (ISL, OSL, cached
tokens) so joint moments are exact — never products of marginals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from llmcap.errors import LlmcapError
from llmcap.trace.stats import window_counts

_EPS = 1e-9  # ceil() guard: 12 × 1.25 / 4 must be 3.75 → 4, and 3.0000000000000004 must stay 3


def ceil_count(x: float) -> int:
    """ceil(x) that ignores floating-point dust above an integer; never below 0."""
    return max(0, math.ceil(x - _EPS * max(1.0, abs(x))))


def _arr(x: ArrayLike) -> NDArray[np.float64]:
    return np.asarray(x, dtype=np.float64)


# ---------------------------------------------------------------- demand (the four ledgers)


@dataclass(frozen=True)
class Demand:
    """What a workload at rate λ asks of a deployment, all as steady-state means."""

    rate_rps: float
    prefill_tokens_s: float  # D_P = λ · E[ISL − cached]
    decode_tokens_s: float  # D_D = λ · E[OSL]
    active_sequences: float  # Little: λ · E[decode residence]
    active_tokens: float  # Little on token-seconds: λ · E[∫ KV tokens held dt] over decode
    kv_bytes: float  # active_tokens × KV bytes per token (whole instance, all ranks)
    kv_budget_tokens: float | None  # instances × KV tokens per instance, when given
    kv_utilisation: float | None  # active_tokens / kv_budget_tokens
    payload_bytes_mean: float  # P→D handoff per request: KV bytes/token × E[ISL_effective]
    pd_bandwidth_avg_bytes_s: float  # λ · E[payload]
    pd_bandwidth_burst_bytes_s: float  # peak windowed rate · E[payload]


def demand(
    rate_rps: float,
    isl: ArrayLike,
    osl: ArrayLike,
    tpot_s: float,
    kv_bytes_per_token: float,
    cached_tokens: ArrayLike | None = None,
    isl_effective: ArrayLike | None = None,
    peak_rate_rps: float | None = None,
    kv_tokens_per_instance: float | None = None,
    instances: int = 1,
) -> Demand:
    """Demand of `rate_rps` requests/s with the per-request (ISL, OSL) pairs of a trace.

    Decode model: a request decodes OSL tokens, one per TPOT, holding ISL + k KV tokens during its k-th
    step, so it holds TPOT · Σ_{k=1..OSL}(ISL + k) = TPOT · (OSL·ISL + OSL(OSL+1)/2) token-seconds and
    stays OSL · TPOT seconds. Little's law turns these into mean active tokens and sequences.
    `isl_effective` is what the P→D handoff moves (default ISL: the whole prompt's KV);
    `peak_rate_rps` (e.g. `windowed_peak_rate` × rate scale) sizes the burst bandwidth (default λ).
    """
    isl_a, osl_a = _arr(isl), _arr(osl)
    if isl_a.shape != osl_a.shape or isl_a.size == 0:
        raise LlmcapError("ISL and OSL must be non-empty arrays of the same length (one pair per request)")
    cached = np.zeros_like(isl_a) if cached_tokens is None else _arr(cached_tokens)
    eff = isl_a if isl_effective is None else _arr(isl_effective)
    lam = float(rate_rps)
    token_seconds = tpot_s * (osl_a * isl_a + osl_a * (osl_a + 1) / 2)
    active_tokens = lam * float(token_seconds.mean())
    budget = None if kv_tokens_per_instance is None else float(kv_tokens_per_instance) * instances
    payload = kv_bytes_per_token * float(eff.mean())
    return Demand(
        rate_rps=lam,
        prefill_tokens_s=lam * float((isl_a - cached).mean()),
        decode_tokens_s=lam * float(osl_a.mean()),
        active_sequences=lam * tpot_s * float(osl_a.mean()),
        active_tokens=active_tokens,
        kv_bytes=active_tokens * kv_bytes_per_token,
        kv_budget_tokens=budget,
        kv_utilisation=None if not budget else active_tokens / budget,
        payload_bytes_mean=payload,
        pd_bandwidth_avg_bytes_s=lam * payload,
        pd_bandwidth_burst_bytes_s=(lam if peak_rate_rps is None else float(peak_rate_rps)) * payload,
    )


def windowed_peak_rate(arrival_s: ArrayLike, window_s: float) -> float:
    """Largest arrivals-per-window ÷ window over full windows (the workload summary's `max`); mean RPS if none."""
    a = np.sort(_arr(arrival_s))
    counts = window_counts(a, window_s)
    if counts.size:
        return float(counts.max() / window_s)
    span = float(a[-1] - a[0]) if a.size > 1 else 0.0
    return a.size / span if span > 0 else 0.0


def peak_to_mean(arrival_s: ArrayLike, window_s: float) -> float:
    """Windowed peak ÷ mean arrivals per window (full windows, as `llmcap.trace.stats.window_rates`); 1 if none."""
    counts = window_counts(np.sort(_arr(arrival_s)), window_s)
    if counts.size == 0 or counts.mean() == 0:
        return 1.0
    return float(counts.max() / counts.mean())


def demand_growth(arrival_s: ArrayLike, window_s: float, horizon_s: float) -> float:
    """Largest rise of the windowed arrival rate (req/s) within `horizon_s`: max over lags of 1..k windows
    (k = horizon ÷ window, at least 1) of rate[i + lag] − rate[i]. What demand can add while a new
    instance is still starting — measured over the horizon itself, not a short-window slope extrapolated
    over it (window-to-window noise is not a trend)."""
    counts = window_counts(np.sort(_arr(arrival_s)), window_s)
    if counts.size < 2:
        return 0.0
    rates = counts / window_s
    k = min(max(1, int(horizon_s // window_s)), rates.size - 1)
    return max(0.0, max(float((rates[lag:] - rates[:-lag]).max()) for lag in range(1, k + 1)))


# ---------------------------------------------------------------- replica counts


@dataclass(frozen=True)
class PoolCount:
    instances: int
    gpus: int
    reasoning: str


def replicas_for(rate_rps: float, per_instance_rps: float, gpus_per_instance: int, headroom: float = 1.0) -> PoolCount:
    """N = ceil(λ · H / G) instances of a config that carries G req/s under the SLOs."""
    if per_instance_rps <= 0:
        raise LlmcapError("per-instance capacity must be > 0 req/s")
    n = ceil_count(rate_rps * headroom / per_instance_rps)
    why = f"ceil({rate_rps:g} × {headroom:g} / {per_instance_rps:g}) = ceil({rate_rps * headroom / per_instance_rps:.4g}) = {n}"
    return PoolCount(n, n * gpus_per_instance, why)


@dataclass(frozen=True)
class PdSizing:
    prefill: PoolCount
    decode: PoolCount

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus


def pd_initial_sizing(
    rate_rps: float,
    prefill_rps: float,
    prefill_gpus: int,
    decode_rps: float,
    decode_gpus: int,
    h_prefill: float = 1.0,
    h_decode: float = 1.0,
) -> PdSizing:
    """docs/domain.md: N_P = ceil(λ·H_P/G_P), N_D = ceil(λ·H_D/G_D), GPUs = N_P·g_P + N_D·g_D (validate by simulation)."""
    return PdSizing(
        replicas_for(rate_rps, prefill_rps, prefill_gpus, h_prefill),
        replicas_for(rate_rps, decode_rps, decode_gpus, h_decode),
    )


# ---------------------------------------------------------------- upper bounds (pruning)


@dataclass(frozen=True)
class RateBounds:
    """Upper bounds on the req/s one instance can sustain, whatever the scheduler does."""

    prefill_compute: float  # prefill tokens/s capacity ÷ E[uncached ISL]
    decode_bandwidth: float  # decode tokens/s capacity ÷ E[OSL]
    kv: float  # KV tokens ÷ E[token-seconds per request] (Little)

    @property
    def rate(self) -> float:
        return min(self.prefill_compute, self.decode_bandwidth, self.kv)

    @property
    def binding(self) -> str:
        vals = {"prefill_compute": self.prefill_compute, "decode_bandwidth": self.decode_bandwidth, "kv": self.kv}
        return min(vals, key=lambda k: (vals[k], k))


def decode_tokens_s_bound(
    max_batch: int,
    weights_bytes_per_rank: float,
    kv_bytes_per_token_per_rank: float,
    mean_context: float,
    hbm_bytes_s: float,
) -> float:
    """Decode tokens/s one instance cannot exceed: every step reads the rank's weights plus the batch's KV.

    Step ≥ (W + B·ctx·kv) / BW and emits B tokens, so tokens/s ≤ B·BW / (W + B·ctx·kv), increasing in B:
    take the largest batch the scheduler (and KV) allows.
    """
    b = float(max_batch)
    return b * hbm_bytes_s / (weights_bytes_per_rank + b * mean_context * kv_bytes_per_token_per_rank)


def rate_bounds(
    isl: ArrayLike,
    osl: ArrayLike,
    prefill_tokens_s: float,
    decode_tokens_s: float,
    kv_tokens: float,
    min_tpot_s: float,
    cached_tokens: ArrayLike | None = None,
) -> RateBounds:
    """Upper bounds on one instance's rate from its capacities (tokens/s, KV tokens, fastest decode step).

    KV: at rate λ the instance holds λ · E[token-seconds] tokens on average (see `demand`), which cannot
    exceed its KV capacity; with the fastest possible TPOT that gives the largest λ.
    """
    isl_a, osl_a = _arr(isl), _arr(osl)
    cached = np.zeros_like(isl_a) if cached_tokens is None else _arr(cached_tokens)
    uncached = float((isl_a - cached).mean())
    token_seconds = min_tpot_s * float((osl_a * isl_a + osl_a * (osl_a + 1) / 2).mean())
    return RateBounds(
        prefill_compute=prefill_tokens_s / uncached if uncached > 0 else math.inf,
        decode_bandwidth=decode_tokens_s / float(osl_a.mean()),
        kv=kv_tokens / token_seconds if token_seconds > 0 else math.inf,
    )


def worth_simulating(bound_rps: float, gpus_per_instance: int, best_goodput_per_gpu: float | None) -> bool:
    """Branch and bound: simulate a candidate only if its bound per GPU can beat the best found so far."""
    if bound_rps <= 0:
        return False
    return best_goodput_per_gpu is None or bound_rps / gpus_per_instance > best_goodput_per_gpu
