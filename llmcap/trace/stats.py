"""Workload characterisation of a canonical trace: pure functions, numbers only (plots live in `plots`).

Conventions (docs/domain.md, "Trace statistics": those of the traces' published figures, so they compare):
percentiles use numpy's linear interpolation; duration is last minus first arrival; mean RPS is
rows ÷ duration; windowed rates count arrivals in fixed windows from the first arrival and drop the
final partial window; inter-arrival CV is std/mean of consecutive gaps, zero gaps included.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.trace import schema
from llmcap.trace.params import CharacteriseParams
from llmcap.trace.prefix import summarise_prefix


def _pkey(p: float) -> str:
    return f"p{p:g}"


def describe(values: np.ndarray, percentiles: list[float]) -> dict[str, float]:
    """mean, the requested percentiles, min and max of a numeric array."""
    values = np.asarray(values, dtype=np.float64)
    out = {"mean": float(values.mean())}
    out.update({_pkey(p): float(q) for p, q in zip(percentiles, np.percentile(values, percentiles), strict=True)})
    out["min"] = float(values.min())
    out["max"] = float(values.max())
    return out


def window_counts(arrival_s: np.ndarray, window_s: float) -> np.ndarray:
    """Arrivals per full window of `window_s` seconds from the first arrival (partial last window dropped)."""
    if arrival_s.size == 0:
        return np.zeros(0, dtype=np.int64)
    rel = arrival_s - arrival_s[0]
    full = int(np.floor(rel[-1] / window_s))
    if full == 0:
        return np.zeros(0, dtype=np.int64)
    bins = np.floor(rel / window_s).astype(np.int64)
    return np.bincount(bins[bins < full], minlength=full)


def window_rates(arrival_s: np.ndarray, window_s: float, percentiles: list[float]) -> dict[str, float | int | None]:
    """Rate percentiles over fixed windows, plus burstiness (CV, index of dispersion, peak/mean)."""
    counts = window_counts(arrival_s, window_s)
    if counts.size == 0:
        return {"windows": 0}
    rates = counts / window_s
    mean = float(counts.mean())
    out: dict[str, float | int | None] = {"windows": int(counts.size)}
    out.update({_pkey(p): float(q) for p, q in zip(percentiles, np.percentile(rates, percentiles), strict=True)})
    out["max"] = float(rates.max())
    out["mean"] = float(rates.mean())
    out["cv"] = float(counts.std() / mean) if mean > 0 else None
    out["index_of_dispersion"] = float(counts.var() / mean) if mean > 0 else None
    out["peak_to_mean"] = float(counts.max() / mean) if mean > 0 else None
    return out


def interarrival_cv(arrival_s: np.ndarray) -> float | None:
    gaps = np.diff(np.sort(arrival_s))
    if gaps.size == 0 or gaps.mean() == 0:
        return None
    return float(gaps.std() / gaps.mean())


def length_buckets(max_len: int, base: float) -> np.ndarray:
    """Log-spaced bucket edges base^0 … base^k covering max_len (integer tokens, bucket = [lo, hi))."""
    k = int(np.ceil(np.log(max_len + 1) / np.log(base)))
    return np.unique(np.floor(base ** np.arange(k + 1)).astype(np.int64))


def joint_distribution(isl: np.ndarray, osl: np.ndarray, base: float) -> dict[str, list]:
    """2-D counts of (ISL, OSL) over log-spaced buckets: rows are ISL buckets, columns OSL buckets."""
    edges = length_buckets(int(max(isl.max(), osl.max())), base)
    counts, _, _ = np.histogram2d(isl, osl, bins=[edges, edges])
    return {"bucket_edges": edges.tolist(), "counts": counts.astype(np.int64).tolist()}


def label_mix(table: pa.Table, top: int = 20) -> dict[str, dict[str, float]]:
    """Share of requests per model / adapter / tenant / feature (only the labels the trace has)."""
    mix: dict[str, dict[str, float]] = {}
    for name in ("model", "adapter", "tenant", "feature"):
        if name not in table.column_names:
            continue
        col = table.column(name)
        if col.null_count == len(col):
            continue
        counts = pc.value_counts(col.fill_null("(none)")).to_pylist()
        counts.sort(key=lambda vc: (-vc["counts"], vc["values"]))
        shares = {vc["values"]: vc["counts"] / len(col) for vc in counts[:top]}
        rest = sum(vc["counts"] for vc in counts[top:])
        if rest:
            shares["(other)"] = rest / len(col)
        mix[name] = shares
    return mix


def summarise_caps(caps: pa.ChunkedArray, osl: np.ndarray, percentiles: Sequence[float]) -> dict:
    """The requests that state a cap on output tokens: how many, cap ÷ real output, and Σ cap ÷ Σ OSL (what a
    scheduler that reserves the cap holds against what the requests use)."""
    given = ~caps.is_null().to_numpy(zero_copy_only=False)
    cap = caps.to_numpy(zero_copy_only=False)[given].astype(np.float64)
    real = osl[given].astype(np.float64)
    ratio = cap / real
    return {
        "requests": int(given.sum()),
        "share": float(given.mean()),
        "cap_over_osl": {f"p{p:g}": float(np.percentile(ratio, p)) for p in percentiles},
        "reserved_over_real": float(cap.sum() / real.sum()),
    }


def characterise(table: pa.Table, params: CharacteriseParams) -> dict:
    """The workload summary of a canonical trace (plain JSON-able dict; keys documented in README)."""
    arrival = np.sort(table.column("arrival_s").to_numpy())  # canonical traces are sorted; be safe
    isl = table.column("isl").to_numpy()
    osl = table.column("osl").to_numpy()
    n = int(arrival.size)
    duration = float(arrival[-1] - arrival[0]) if n else 0.0
    varying = (
        n > 2 and np.ptp(isl) > 0 and np.ptp(osl) > 0
    )  # a constant column has no correlation: undefined, not a warning
    from scipy import stats as sstats  # here: scipy is slow to import and only characterisation needs it

    spearman = sstats.spearmanr(isl, osl).statistic if varying else float("nan")
    summary: dict = {
        "rows": n,
        "start": (table.schema.metadata or {}).get(b"llmcap.start", b"").decode(),
        "duration_s": duration,
        "mean_rps": n / duration if duration > 0 else None,
        "isl": describe(isl, params.percentiles),
        "osl": describe(osl, params.percentiles),
        "corr_pearson": float(np.corrcoef(isl, osl)[0, 1]) if varying else None,
        "corr_spearman": float(spearman) if n > 2 else None,
        "interarrival_cv": interarrival_cv(arrival),
        "zero_gap_share": float((np.diff(arrival) == 0).mean()) if n > 1 else None,
        "rps_windows": {f"{w:g}s": window_rates(arrival, w, params.percentiles) for w in params.rps_windows_s},
        "joint": joint_distribution(isl, osl, params.length_bucket_base),
        "mix": label_mix(table),
    }
    caps = table.column("max_tokens")
    if caps.null_count < len(caps):
        summary["max_tokens"] = summarise_caps(caps, osl, params.percentiles)
    block_size = schema.block_size_of(table)
    hashes = table.column("hash_ids")
    if block_size and hashes.null_count < len(hashes):
        summary["prefix"] = summarise_prefix(hashes, isl, block_size, params.lru_cache_blocks).as_dict()
    return summary
