"""Measured beside predicted: per-(run, ISL bucket, OSL bucket) latency percentiles, attainment per run, and
the verdict on the plan's max feasible rate.

ITL here is each request's mean inter-token gap (TPOT), the per-request statistic both record tables
carry; percentiles are over the ok requests of the bucket. The verdict reads the lowest and highest
scales: the predicted max rate is confirmed when the unit holds the SLOs at the lowest scale and misses
them at the highest, i.e. the measured knee lies within [lowest, highest] x the predicted rate.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.sizing.params import SloParams
from llmcap.sizing.slo import attainment

PERCENTILES = (50, 90, 99)
STATUSES = ("ok", "unfinished", "rejected")


def bucket_labels(edges: list[int]) -> list[str]:
    """`[4096, 16384]` -> ["<4096", "4096-16383", ">=16384"]."""
    bounds = [0, *edges]
    labels = [f"<{edges[0]}"] if edges else ["all"]
    labels += [f"{lo}-{hi - 1}" for lo, hi in zip(bounds[1:], bounds[2:])]
    return labels + [f">={edges[-1]}"] if edges else labels


def bucket_of(values: np.ndarray, edges: list[int]) -> np.ndarray:
    return np.asarray(bucket_labels(edges), dtype=object)[np.searchsorted(np.asarray(edges), values, side="right")]


def _pcts(x: np.ndarray) -> list[float | None]:
    x = x[np.isfinite(x)]
    return [None] * len(PERCENTILES) if x.size == 0 else [float(v) for v in np.percentile(x, PERCENTILES) * 1e3]


def _side(records: pa.Table, isl_edges: list[int], osl_edges: list[int]) -> dict[tuple[str, str, str], dict[str, Any]]:
    ok = records.filter(pc.equal(records["status"], "ok"))
    run = np.asarray(ok.column("run").to_pylist(), dtype=object)
    isl_b = bucket_of(ok.column("isl").to_numpy(), isl_edges)
    osl_b = bucket_of(ok.column("osl").to_numpy(), osl_edges)
    ttft = ok.column("ttft_s").to_numpy(zero_copy_only=False).astype(np.float64)
    itl = ok.column("tpot_s").to_numpy(zero_copy_only=False).astype(np.float64)
    out = {}
    for key in sorted(set(zip(run, isl_b, osl_b))):
        m = (run == key[0]) & (isl_b == key[1]) & (osl_b == key[2])
        out[key] = {"n": int(m.sum()), "ttft_ms": _pcts(ttft[m]), "itl_ms": _pcts(itl[m])}
    return out


def bucket_table(measured: pa.Table, predicted: pa.Table, isl_edges: list[int], osl_edges: list[int], run_order: list[str]) -> list[dict[str, Any]]:
    """One row per (run, ISL bucket, OSL bucket) with ok requests on either side: counts and p50/p90/p99 of
    TTFT and ITL, measured and predicted, in ms (None where a side has no request there)."""
    m, p = _side(measured, isl_edges, osl_edges), _side(predicted, isl_edges, osl_edges)
    isl_order, osl_order = bucket_labels(isl_edges), bucket_labels(osl_edges)
    keys = sorted(set(m) | set(p), key=lambda k: (run_order.index(k[0]), isl_order.index(k[1]), osl_order.index(k[2])))
    empty = {"n": 0, "ttft_ms": [None] * 3, "itl_ms": [None] * 3}
    rows = []
    for key in keys:
        a, b = m.get(key, empty), p.get(key, empty)
        row: dict[str, Any] = {"run": key[0], "isl_bucket": key[1], "osl_bucket": key[2], "n_measured": a["n"], "n_predicted": b["n"]}
        for metric in ("ttft_ms", "itl_ms"):
            for i, q in enumerate(PERCENTILES):
                row[f"{metric[:-3]}_p{q}_measured_ms"] = a[metric][i]
                row[f"{metric[:-3]}_p{q}_predicted_ms"] = b[metric][i]
        rows.append(row)
    return rows


def run_summary(records: pa.Table, slo: SloParams) -> dict[str, Any]:
    """Requests, statuses and SLO attainment (steady window) of one run's records."""
    status = records.column("status").to_pylist()
    return {"requests": records.num_rows, "status": {s: status.count(s) for s in STATUSES},
            "attainment": attainment(records, slo) if records.num_rows else None}  # fmt: skip


def verdict(attainments: dict[float, float | None], target: float, invalid: list[str] | None = None) -> dict[str, Any]:
    """Holds at the lowest scale, fails at the highest, and the knee: the highest scale held below the first miss.
    `invalid`: runs whose sends ran late past the bound; their latencies are the client's, so nothing is confirmed."""
    scales = sorted(attainments)
    holds = {s: attainments[s] is not None and attainments[s] >= target for s in scales}  # type: ignore[operator]
    knee = None
    for s in scales:
        if not holds[s]:
            break
        knee = s
    low, high = scales[0], scales[-1]
    confirmed = holds[low] and not holds[high] and not invalid
    text = (f"confirmed: holds at {low:g}x, fails at {high:g}x (knee within [{low:g}, {high:g}]x the predicted rate)" if confirmed
            else f"NOT confirmed: {'holds' if holds[low] else 'fails'} at {low:g}x, {'fails' if not holds[high] else 'still holds'} at {high:g}x")
    if invalid:
        text += f"; INVALID runs {', '.join(invalid)} (sends ran late past replay.max_lateness_ms: the client's latency, not the server's)"
    return {
        "holds_at_low": holds[low], "fails_at_high": not holds[high], "band": [low, high], "knee_scale": knee,
        "knee_in_band": confirmed, "holds": {f"{s:g}x": holds[s] for s in scales}, "invalid_runs": invalid or [], "text": text,
    }  # fmt: skip
