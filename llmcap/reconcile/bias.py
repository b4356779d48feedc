"""Prediction error per bucket: e = predicted / measured - 1 for TTFT and ITL at each percentile, with a
paired bootstrap confidence interval.

Measured and predicted records (REQUEST_SCHEMA, plus `run` / `excerpt_seed` from a replay and
`tenant` / `model` where present) are paired by (run, excerpt_seed, request_id): both sides describe
the same request, so the bootstrap resamples requests, not the two sides independently. Every input
request is accounted for: paired and served on both sides, or counted under why it was left out.

A bucket is ISL range × OSL range × run (the replay's rate share, e.g. "0.8x") × tenant × model. The
ITL of a request is its mean gap (`tpot_s`); requests with one output token have none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from llmcap.errors import LlmcapError
from llmcap.reconcile.params import ReconcileParams

KEYS = ("run", "excerpt_seed", "request_id")  # those present pair the two sides
GROUPS = ("run", "tenant", "model")  # those present split buckets besides ISL and OSL
REQUIRED = ("request_id", "arrival_s", "isl", "osl", "ttft_s", "tpot_s", "status")
METRICS = {"ttft": "ttft_s", "itl": "tpot_s"}


@dataclass(frozen=True)
class Estimate:
    e: float  # predicted / measured - 1 at this percentile
    low: float  # confidence interval of e
    high: float
    measured_s: float
    predicted_s: float


@dataclass(frozen=True)
class BucketBias:
    key: dict[str, str]  # isl, osl, and run / tenant / model where present
    requests: int  # paired, served on both sides
    errors: dict[str, dict[float, Estimate]]  # metric ("ttft", "itl") -> percentile -> estimate
    isl_range: tuple[int, int | None]
    # metric -> measured / predicted per request (finite only): what a correction factor is fitted on
    request_ratios: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.key.items())


@dataclass(frozen=True)
class Accounting:
    measured: int
    predicted: int
    paired_ok: int
    only_measured: int
    only_predicted: int
    not_ok: dict[str, int]  # "measured:unfinished" -> count, etc. (paired, but not served on a side)


def _require(table: pa.Table, side: str) -> None:
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise LlmcapError(f"{side} records: missing column(s) {', '.join(missing)} (expected llmcap's request schema)")


def _key_columns(measured: pa.Table, predicted: pa.Table) -> list[str]:
    keys = [k for k in KEYS if k in measured.column_names and k in predicted.column_names]
    for k in KEYS:
        if (k in measured.column_names) != (k in predicted.column_names):
            raise LlmcapError(
                f"column '{k}' is in the {'measured' if k in measured.column_names else 'predicted'} records only: "
                "both sides must carry it to be paired"
            )
    return keys


def _keys(table: pa.Table, cols: list[str], side: str) -> list[tuple]:
    keys = list(zip(*(table.column(c).to_pylist() for c in cols), strict=True))
    if len(set(keys)) != len(keys):
        seen: set[tuple] = set()
        dup = next(k for k in keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise LlmcapError(f"{side} records: ({', '.join(cols)}) = {dup} appears more than once")
    return keys


def pair(measured: pa.Table, predicted: pa.Table) -> tuple[pa.Table, pa.Table, Accounting]:
    """The rows served ("ok") on both sides, aligned, and where every other request went."""
    _require(measured, "measured")
    _require(predicted, "predicted")
    cols = _key_columns(measured, predicted)
    mk, pk = _keys(measured, cols, "measured"), _keys(predicted, cols, "predicted")
    p_index = {k: i for i, k in enumerate(pk)}
    m_status, p_status = measured.column("status").to_pylist(), predicted.column("status").to_pylist()
    mi, pi = [], []
    not_ok: dict[str, int] = {}
    for i, k in enumerate(mk):
        j = p_index.get(k)
        if j is None:
            continue
        if m_status[i] == "ok" and p_status[j] == "ok":
            mi.append(i)
            pi.append(j)
            continue
        for side, s in (("measured", m_status[i]), ("predicted", p_status[j])):
            if s != "ok":
                not_ok[f"{side}:{s}"] = not_ok.get(f"{side}:{s}", 0) + 1
    both = len(set(mk) & set(pk))
    acc = Accounting(
        measured.num_rows, predicted.num_rows, len(mi), measured.num_rows - both, predicted.num_rows - both, not_ok
    )
    m, p = measured.take(pa.array(mi, pa.int64())), predicted.take(pa.array(pi, pa.int64()))
    if (
        m.column("isl").to_pylist() != p.column("isl").to_pylist()
        or m.column("osl").to_pylist() != p.column("osl").to_pylist()
    ):
        raise LlmcapError(
            "measured and predicted records disagree on isl/osl for the same request: not the same excerpt"
        )
    return m, p, acc


def _range_labels(
    values: np.ndarray, edges: tuple[int, ...]
) -> tuple[np.ndarray, list[str], list[tuple[int, int | None]]]:
    idx = np.searchsorted(np.asarray(edges), values, side="right") - 1
    ranges = [(lo, edges[k + 1] if k + 1 < len(edges) else None) for k, lo in enumerate(edges)]
    labels = [f"[{lo},{hi})" if hi is not None else f"[{lo},inf)" for lo, hi in ranges]
    return idx, labels, ranges


def _f64(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)  # nulls -> NaN


def bucket_biases(measured: pa.Table, predicted: pa.Table, params: ReconcileParams) -> list[BucketBias]:
    """e per bucket for paired, served requests (`pair`'s output), buckets in sorted key order."""
    isl = measured.column("isl").to_numpy()
    isl_idx, isl_labels, isl_ranges = _range_labels(isl, params.isl_edges)
    osl_idx, osl_labels, _ = _range_labels(measured.column("osl").to_numpy(), params.osl_edges)
    groups = [g for g in GROUPS if g in measured.column_names]
    group_vals = [[str(v) for v in measured.column(g).to_pylist()] for g in groups]
    keys = [
        (int(a), int(b), *(gv[i] for gv in group_vals)) for i, (a, b) in enumerate(zip(isl_idx, osl_idx, strict=True))
    ]
    order = np.argsort(_f64(measured, "arrival_s"), kind="stable")
    values = {m: (_f64(measured, col), _f64(predicted, col)) for m, col in METRICS.items()}
    members: dict[tuple, list[int]] = {}
    for i in order.tolist():  # arrival order within each bucket
        members.setdefault(keys[i], []).append(i)
    out = []
    for n, key in enumerate(sorted(members)):
        rows = np.array(members[key], dtype=np.int64)
        label = {"isl": isl_labels[key[0]], "osl": osl_labels[key[1]], **dict(zip(groups, key[2:], strict=True))}
        rng = np.random.default_rng([params.seed, n])
        errors, ratios = {}, {}
        for metric, (mv, pv) in values.items():
            m, p = mv[rows], pv[rows]
            ok = np.isfinite(m) & np.isfinite(p) & (p > 0)
            ratios[metric] = m[ok] / p[ok]
            errors[metric] = _estimates(m[ok], p[ok], params, rng) if ok.sum() >= 2 else {}
        out.append(BucketBias(label, int(rows.size), errors, isl_ranges[key[0]], ratios))
    return out


def _estimates(
    m: np.ndarray, p: np.ndarray, params: ReconcileParams, rng: np.random.Generator
) -> dict[float, Estimate]:
    qs = np.asarray(params.percentiles) / 100.0
    idx = rng.integers(0, m.size, size=(params.bootstrap, m.size))
    boot = np.quantile(p[idx], qs, axis=1) / np.quantile(m[idx], qs, axis=1) - 1.0  # (percentiles, resamples)
    alpha = (1.0 - params.confidence) / 2.0
    low, high = np.quantile(boot, [alpha, 1.0 - alpha], axis=1)
    mq, pq = np.quantile(m, qs), np.quantile(p, qs)
    return {
        float(q): Estimate(float(pq[k] / mq[k] - 1.0), float(low[k]), float(high[k]), float(mq[k]), float(pq[k]))
        for k, q in enumerate(params.percentiles)
    }
