"""Diagnosis from engine metrics over time (the table in docs/domain.md), window by window:

| pattern                                        | reading                                           |
|------------------------------------------------|---------------------------------------------------|
| requests waiting, KV usage low                 | compute / queue bound: the engine is too slow for the arrivals |
| requests waiting, KV usage high                | memory / concurrency bound: no KV room to admit more |
| preemptions                                    | the operating point is too aggressive             |
| prefix-cache hit rate down vs the baseline     | routing or cache warm-up changed prefill demand   |
| ITL up vs the baseline with the P→D link busy  | collective / transfer contention                  |

The series is cut into windows of `window_s`; gauges are averaged over a window's scrapes (waiting
summed over engines, KV usage the fullest engine), counters read as their growth over the window.
The baseline (hit rate, mean ITL) is a reference series when one is given (a healthy run, the
profile's), else the run's own best window before. Consecutive windows with the same reading are one
finding (when at least `min_windows` of them), naming its window and the metric values behind it. Every finding is a co-occurrence in the
metrics: correlation, not a proven cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import pyarrow as pa

from llmcap.errors import LlmcapError
from llmcap.reconcile.metric_schema import MetricSchema, detect_schema
from llmcap.reconcile.params import DiagnoseParams

CAVEAT = "these metrics moved together in this window; that is correlation, not a proven cause"
READINGS = {
    "compute_bound": "compute / queue bound: requests wait while KV memory is free, the engine is too slow for the arrivals",
    "memory_bound": "memory / concurrency bound: requests wait while the KV cache is full, there is no room to admit them",
    "preemptions": "operating point too aggressive: running requests are preempted (KV exhausted mid-decode)",
    "prefix_hit_drop": "routing or cache warm-up changed the prefill demand: the prefix cache hits less than the baseline",
    "transfer_contention": "collective / transfer contention: ITL rose while the P→D KV link was busy",
}


@dataclass(frozen=True)
class Window:
    start_s: float
    end_s: float
    values: dict[str, float]  # waiting, running, kv_usage, preemptions_per_s, prefix_hit_rate, itl_mean_s, link_busy


@dataclass(frozen=True)
class Finding:
    kind: str  # a READINGS key
    start_s: float
    end_s: float
    values: dict[str, float]  # means over its windows of the metrics behind the reading
    baseline: dict[str, float]  # the reference values the reading compared against (if any)
    reading: str
    windows: int  # how many consecutive windows showed it
    caveat: str = CAVEAT

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "window_s": [self.start_s, self.end_s],
            "values": self.values,
            "baseline": self.baseline,
            "reading": self.reading,
            "caveat": self.caveat,
        }

    def __str__(self) -> str:
        vals = ", ".join(f"{k} {v:.3g}" for k, v in self.values.items())
        base = f" (baseline {', '.join(f'{k} {v:.3g}' for k, v in self.baseline.items())})" if self.baseline else ""
        return f"[{self.start_s:.0f}, {self.end_s:.0f}) s: {self.reading} — {vals}{base}; {self.caveat}"


@dataclass(frozen=True)
class Diagnosis:
    schema: str
    missing: tuple[str, ...]  # quantities the series does not carry (their rules did not run)
    windows: list[Window]
    findings: list[Finding]

    def to_dict(self) -> dict:
        return {
            "schema": self.schema,
            "missing": list(self.missing),
            "windows": len(self.windows),
            "findings": [f.to_dict() for f in self.findings],
        }


class _Series:
    """Per quantity: the scrape times and, per scrape, the value summed (or maxed) over engines."""

    def __init__(self, table: pa.Table, schema: MetricSchema) -> None:
        t = table.column("time_s").to_numpy()
        names = np.asarray(table.column("name").to_pylist())
        values = table.column("value").to_numpy()
        self.times = np.unique(t)
        self.data: dict[str, np.ndarray] = {}
        for quantity, name in schema.names().items():
            sel = names == name
            if not sel.any():
                continue
            idx = np.searchsorted(self.times, t[sel])
            reduce = np.maximum if quantity == "kv_usage" else np.add  # the fullest engine; totals otherwise
            acc = np.full(self.times.size, -np.inf if quantity == "kv_usage" else 0.0)
            reduce.at(acc, idx, values[sel])
            acc[np.isinf(acc)] = np.nan
            self.data[quantity] = acc

    def mean(self, q: str, lo: int, hi: int) -> float:
        if q not in self.data:
            return np.nan
        v = self.data[q][lo:hi]
        v = v[np.isfinite(v)]
        return float(v.mean()) if v.size else np.nan

    def growth(self, q: str, lo: int, hi: int) -> float:
        """Counter growth from the last scrape before the window (or its first) to its last (callers pass hi > lo)."""
        if q not in self.data:
            return np.nan
        a = self.data[q]
        return float(a[hi - 1] - a[max(lo - 1, 0)])


def _windows(s: _Series, window_s: float) -> list[Window]:
    if s.times.size < 2:
        return []
    t0, t1 = float(s.times[0]), float(s.times[-1])
    out = []
    edges = np.arange(t0, t1 + window_s, window_s)
    for a, b in pairwise(edges.tolist()):
        lo, hi = int(np.searchsorted(s.times, a)), int(np.searchsorted(s.times, b))  # side "left": [a, b)
        if b >= t1:
            hi = s.times.size
        if hi <= lo:
            continue
        span = float(s.times[hi - 1] - s.times[max(lo - 1, 0)]) or window_s
        queries, itl_n = s.growth("prefix_queries", lo, hi), s.growth("itl_count", lo, hi)
        out.append(
            Window(
                float(a),
                float(min(b, t1)),
                {
                    "waiting": s.mean("waiting", lo, hi),
                    "running": s.mean("running", lo, hi),
                    "kv_usage": s.mean("kv_usage", lo, hi),
                    "preemptions_per_s": s.growth("preemptions", lo, hi) / span,
                    "prefix_hit_rate": s.growth("prefix_hits", lo, hi) / queries if queries > 0 else np.nan,
                    "itl_mean_s": s.growth("itl_sum", lo, hi) / itl_n if itl_n > 0 else np.nan,
                    "link_busy": s.growth("kv_link_busy", lo, hi) / span,
                },
            )
        )
    return out


def _overall(s: _Series) -> dict[str, float]:
    n = s.times.size
    queries, itl_n = s.growth("prefix_queries", 0, n), s.growth("itl_count", 0, n)
    return {
        "prefix_hit_rate": s.growth("prefix_hits", 0, n) / queries if queries > 0 else np.nan,
        "itl_mean_s": s.growth("itl_sum", 0, n) / itl_n if itl_n > 0 else np.nan,
    }


def _readings(w: dict[str, float], base: dict[str, float], p: DiagnoseParams) -> dict[str, tuple[dict, dict]]:
    """kind -> (values behind it, baseline values) for the readings this window shows."""
    out: dict[str, tuple[dict, dict]] = {}
    waiting, kv = w["waiting"], w["kv_usage"]
    if waiting >= p.waiting_min and kv < p.kv_low:
        out["compute_bound"] = ({"waiting": waiting, "kv_usage": kv}, {})
    if waiting >= p.waiting_min and kv >= p.kv_high:
        out["memory_bound"] = ({"waiting": waiting, "kv_usage": kv}, {})
    if w["preemptions_per_s"] >= p.preemptions_per_s:
        out["preemptions"] = ({"preemptions_per_s": w["preemptions_per_s"], "kv_usage": kv}, {})
    hit, base_hit = w["prefix_hit_rate"], base["prefix_hit_rate"]
    if hit <= base_hit - p.prefix_hit_drop:
        out["prefix_hit_drop"] = ({"prefix_hit_rate": hit}, {"prefix_hit_rate": base_hit})
    itl, base_itl = w["itl_mean_s"], base["itl_mean_s"]
    if itl >= base_itl * (1.0 + p.itl_rise) and w["link_busy"] >= p.network_high:
        out["transfer_contention"] = ({"itl_mean_s": itl, "link_busy": w["link_busy"]}, {"itl_mean_s": base_itl})
    return out  # comparisons with NaN are False: a quantity the series lacks shows nothing


def diagnose(
    series: pa.Table, params: DiagnoseParams, schema: MetricSchema | None = None, baseline: pa.Table | None = None
) -> Diagnosis:
    """Findings of `series` (SERIES_SCHEMA); `schema` None: detected from its names; `baseline`: a
    reference series (e.g. a healthy run) for the hit rate and ITL, else the run's best earlier window."""
    if series.num_rows == 0:
        raise LlmcapError("the metric series is empty: nothing to diagnose")
    names = set(series.column("name").to_pylist())
    schema = schema or detect_schema(names)
    missing = tuple(q for q, n in schema.names().items() if n not in names)
    s = _Series(series, schema)
    windows = _windows(s, params.window_s)
    fixed = _overall(_Series(baseline, schema)) if baseline is not None else None
    findings: list[Finding] = []
    open_: dict[str, list] = {}  # kind -> [start, end, [values...], baseline]
    best = {"prefix_hit_rate": np.nan, "itl_mean_s": np.nan}
    for w in windows:
        base = fixed if fixed is not None else best
        seen = _readings(w.values, base, params)
        for kind in [k2 for k2 in open_ if k2 not in seen]:
            findings.append(_close(kind, *open_.pop(kind)))
        for kind, (vals, b) in seen.items():
            if kind in open_:
                open_[kind][1] = w.end_s
                open_[kind][2].append(vals)
            else:
                open_[kind] = [w.start_s, w.end_s, [vals], b]
        if fixed is None:  # the run's best so far: highest hit rate, lowest ITL
            best = {
                "prefix_hit_rate": _pick(max, best["prefix_hit_rate"], w.values["prefix_hit_rate"]),
                "itl_mean_s": _pick(min, best["itl_mean_s"], w.values["itl_mean_s"]),
            }
    for kind, rest in open_.items():
        findings.append(_close(kind, *rest))
    findings = [f for f in findings if f.windows >= params.min_windows]
    findings.sort(key=lambda f: (f.start_s, f.kind))
    return Diagnosis(schema.name, missing, windows, findings)


def _pick(choose, a: float, b: float) -> float:
    finite = [x for x in (a, b) if np.isfinite(x)]
    return float(choose(finite)) if finite else np.nan


def _close(kind: str, start: float, end: float, values: list[dict], baseline: dict) -> Finding:
    mean = {k: float(np.mean([v[k] for v in values])) for k in values[0]}
    return Finding(kind, start, end, mean, {k: float(v) for k, v in baseline.items()}, READINGS[kind], len(values))
