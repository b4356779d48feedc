"""Measured beside predicted: per-(run, ISL bucket, OSL bucket) latency percentiles, attainment per run, and
the verdict on the plan's max feasible rate.

ITL here is each request's mean inter-token gap (TPOT), the per-request statistic both record tables
carry; percentiles are over the ok requests of the bucket. The verdict reads the lowest and highest
scales: the predicted max rate is confirmed when the unit holds the SLOs at the lowest scale and misses
them at the highest, i.e. the measured knee lies within [lowest, highest] x the predicted rate.

Each run's attainment is a share of its steady-window requests, so it is judged with its Wilson score
interval at `CONFIDENCE`: the run holds when the interval's lower bound reaches the target, fails when its
upper bound stays below it, and is inconclusive otherwise (too few requests to tell: with every request
meeting the SLOs, a 99% target needs about 380 of them). A scale holds when every seed's run holds and
fails when any fails; one miss among 40 requests decides nothing.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.sizing.params import SloParams
from llmcap.sizing.slo import goodput

PERCENTILES = (50, 90, 99)
STATUSES = ("ok", "unfinished", "rejected")
CONFIDENCE = 0.95


def bucket_labels(edges: list[int]) -> list[str]:
    """`[4096, 16384]` -> ["<4096", "4096-16383", ">=16384"]."""
    labels = [f"<{edges[0]}"] if edges else ["all"]
    labels += [f"{lo}-{hi - 1}" for lo, hi in pairwise(edges)]
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
    for key in sorted(set(zip(run, isl_b, osl_b, strict=True))):
        m = (run == key[0]) & (isl_b == key[1]) & (osl_b == key[2])
        out[key] = {"n": int(m.sum()), "ttft_ms": _pcts(ttft[m]), "itl_ms": _pcts(itl[m])}
    return out


def bucket_table(
    measured: pa.Table, predicted: pa.Table, isl_edges: list[int], osl_edges: list[int], run_order: list[str]
) -> list[dict[str, Any]]:
    """One row per (run, ISL bucket, OSL bucket) with ok requests on either side: counts and p50/p90/p99 of
    TTFT and ITL, measured and predicted, in ms (None where a side has no request there)."""
    m, p = _side(measured, isl_edges, osl_edges), _side(predicted, isl_edges, osl_edges)
    isl_order, osl_order = bucket_labels(isl_edges), bucket_labels(osl_edges)
    keys = sorted(set(m) | set(p), key=lambda k: (run_order.index(k[0]), isl_order.index(k[1]), osl_order.index(k[2])))
    empty = {"n": 0, "ttft_ms": [None] * len(PERCENTILES), "itl_ms": [None] * len(PERCENTILES)}
    rows = []
    for key in keys:
        a, b = m.get(key, empty), p.get(key, empty)
        row: dict[str, Any] = {
            "run": key[0],
            "isl_bucket": key[1],
            "osl_bucket": key[2],
            "n_measured": a["n"],
            "n_predicted": b["n"],
        }
        for metric in ("ttft_ms", "itl_ms"):
            for i, q in enumerate(PERCENTILES):
                row[f"{metric[:-3]}_p{q}_measured_ms"] = a[metric][i]
                row[f"{metric[:-3]}_p{q}_predicted_ms"] = b[metric][i]
        rows.append(row)
    return rows


def run_summary(records: pa.Table, slo: SloParams) -> dict[str, Any]:
    """Requests, statuses and SLO attainment (steady window: `judged` requests, `met` of them qualified) of one run."""
    status = records.column("status").to_pylist()
    out: dict[str, Any] = {
        "requests": records.num_rows,
        "status": {s: status.count(s) for s in STATUSES},
        "attainment": None,
        "judged": 0,
        "met": 0,
    }
    if records.num_rows:
        g = goodput(records, slo)
        out |= {"attainment": g.attainment, "judged": g.requests, "met": g.qualified}
    return out


def wilson(met: int, judged: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of the share `met / judged` ((0, 1) with nothing judged)."""
    if judged <= 0:
        return 0.0, 1.0
    from scipy.stats import binomtest  # here: scipy is slow to import and only the verdict needs it

    ci = binomtest(met, judged).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


Judgement = str  # "holds" | "fails" | "inconclusive"


def judge_runs(runs: list[tuple[int, int]], target: float) -> tuple[Judgement, tuple[float, float], int]:
    """A scale's runs, each (met, judged): fails if any run's upper bound is below `target`, holds if every run's
    lower bound reaches it, else inconclusive; with the deciding run's bounds and its n."""
    bounds = [(wilson(k, n), n) for k, n in runs]
    failing = [b for b in bounds if b[0][1] < target]
    if failing:
        (lo, hi), n = min(failing, key=lambda b: b[0][1])
        return "fails", (lo, hi), n
    (lo, hi), n = min(bounds, key=lambda b: b[0][0])  # the least certain run decides
    return ("holds" if lo >= target else "inconclusive"), (lo, hi), n


def verdict(
    runs: dict[float, list[tuple[int, int]]], target: float, invalid: list[str] | None = None
) -> dict[str, Any]:
    """Holds at the lowest scale, fails at the highest, and the knee: the highest scale held below the first scale
    not held; each scale's runs (met, judged) per seed judged with `CONFIDENCE` bounds (module docstring).
    `invalid`: runs whose sends ran late past the bound; their latencies are the client's, so nothing is confirmed."""
    scales = sorted(runs)
    judged = {s: judge_runs(runs[s], target) for s in scales}
    knee = None
    for s in scales:
        if judged[s][0] != "holds":
            break
        knee = s
    low, high = scales[0], scales[-1]

    def said(s: float) -> str:
        j, (lo, hi), n = judged[s]
        bound = f"{CONFIDENCE:.0%} bounds {lo:.3f}–{hi:.3f} on {n} requests"
        return {
            "holds": f"holds at {s:g}x ({bound})",
            "fails": f"fails at {s:g}x ({bound})",
            "inconclusive": f"inconclusive at {s:g}x ({bound}: too few to resolve {target:g})",
        }[j]

    j_low, j_high = judged[low][0], judged[high][0]
    if j_low == "holds" and j_high == "fails":
        outcome = "confirmed"
    elif j_low == "fails" or j_high == "holds":
        outcome = "contradicted"
    else:
        outcome = "inconclusive"
    head = {"confirmed": "confirmed", "contradicted": "NOT confirmed", "inconclusive": "inconclusive"}[outcome]
    text = f"{head}: {said(low)}, {said(high)}" + (
        f" (knee within [{low:g}, {high:g}]x the predicted rate)" if outcome == "confirmed" else ""
    )
    if invalid:
        text += f"; INVALID runs {', '.join(invalid)} (sends ran late past replay.max_lateness_ms: the client's latency, not the server's)"
    confirmed = outcome == "confirmed" and not invalid
    return {
        "outcome": "invalid" if invalid else outcome,
        "holds_at_low": j_low == "holds",
        "fails_at_high": j_high == "fails",
        "band": [low, high],
        "knee_scale": knee,
        "knee_in_band": confirmed,
        "holds": {f"{s:g}x": judged[s][0] == "holds" for s in scales},
        "judgement": {f"{s:g}x": judged[s][0] for s in scales},
        "bounds": {f"{s:g}x": list(judged[s][1]) for s in scales},
        "confidence": CONFIDENCE,
        "invalid_runs": invalid or [],
        "text": text,
    }
