"""Measured profile tables: storage, schema and interpolation.

A profile is a directory:

    fingerprint.json   the EnvironmentFingerprint it was measured in (see fingerprint.py)
    points.parquet     measured timings over the grid, POINTS_SCHEMA (one row per grid cell)
    steps.parquet      step observations the fit used, STEPS_SCHEMA
    fit.json           the calibrated LinearStepModel + client overhead (calibrate.CalibratedFit)
    manifest.json      format version, fingerprint hash, source, the experiment spec

POINTS_SCHEMA — one row per grid cell (times in seconds, medians over `repeats` runs):
- source: "endpoint" (our profiler) | "vllm-bench-serve" (imported per-request JSON)
- isl, osl: prompt and output tokens of every request in the cell (imports: the bucket's median)
- concurrency: requests started together; batch_size: sequences decoding together in the steady
  window (all requests past prefill, none finished) — equal for the profiler's bursts
- kv_load: fraction of the KV capacity the steady batch holds, batch·(isl + osl/2)/capacity
  (null when the capacity is unknown); cache_hit: fraction of each prompt served by the prefix
  cache (0: the profiler's prompts are unique)
- tp, pp, ep, dp: parallelism of the engine instance
- repeats, requests: runs and requests behind the row
- ttft_s, ttft_p90_s: time to first token (at concurrency 1: client overhead + one prefill)
- itl_mean_s: the steady decode step time (median over runs), from `itl_source`: "client" = the
  SSE streams' steady window; "server" = the engine's own ITL histogram (/metrics) where the server
  held every stream back so the client saw bursts; itl_server_mean_s: the latter, always (null if
  not exposed; it averages all gaps of a run, prefill interference included);
  itl_p50_s / itl_p90_s / itl_p99_s / itl_max_s: over all steady gaps pooled; steady_gaps: how many
- decode_context_mean: mean context of the steady decode steps
- tpot_mean_s: mean per-request TPOT over the whole request (includes prefill interference)
- preemptions: engine preemptions during the cell (/metrics delta; null where not exposed)

STEPS_SCHEMA — one row per observation (see calibrate.StepObservations): kind (prefill|decode),
isl, concurrency, the summed batch terms (steps, prefill_tokens, prefill_pairs, prefill_seqs,
decode_seqs, decode_context, client), seconds, and count (measurements averaged into it).

Interpolation (`interpolate`) is monotone (PCHIP on log metric vs log ISL, values made
non-decreasing along ISL and concurrency first: more tokens never step faster) and linear in log
space between concurrency levels. Outside the measured range it extends the end segment's log-log
slope and sets `extrapolated` for that query — never silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import ArrayLike

from llmcap.errors import InputFileError
from llmcap.perf.calibrate import CalibratedFit, StepObservations
from llmcap.perf.fingerprint import EnvironmentFingerprint, fingerprint_hash
from llmcap.perf.model import F64, StepBatch

FORMAT_VERSION = 1

POINTS_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("isl", pa.int64(), nullable=False),
        pa.field("osl", pa.int64(), nullable=False),
        pa.field("concurrency", pa.int32(), nullable=False),
        pa.field("batch_size", pa.int32(), nullable=False),
        pa.field("kv_load", pa.float64()),
        pa.field("cache_hit", pa.float64(), nullable=False),
        pa.field("tp", pa.int32(), nullable=False),
        pa.field("pp", pa.int32(), nullable=False),
        pa.field("ep", pa.int32(), nullable=False),
        pa.field("dp", pa.int32(), nullable=False),
        pa.field("repeats", pa.int32(), nullable=False),
        pa.field("requests", pa.int32(), nullable=False),
        pa.field("ttft_s", pa.float64()),
        pa.field("ttft_p90_s", pa.float64()),
        pa.field("itl_mean_s", pa.float64()),
        pa.field("itl_source", pa.string()),
        pa.field("itl_server_mean_s", pa.float64()),
        pa.field("itl_p50_s", pa.float64()),
        pa.field("itl_p90_s", pa.float64()),
        pa.field("itl_p99_s", pa.float64()),
        pa.field("itl_max_s", pa.float64()),
        pa.field("steady_gaps", pa.int64(), nullable=False),
        pa.field("decode_context_mean", pa.float64()),
        pa.field("tpot_mean_s", pa.float64()),
        pa.field("preemptions", pa.int64()),
    ]
)

STEPS_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("isl", pa.int64(), nullable=False),
        pa.field("concurrency", pa.int32(), nullable=False),
        *(
            pa.field(name, pa.float64(), nullable=False)
            for name in (
                "steps",
                "prefill_tokens",
                "prefill_pairs",
                "prefill_seqs",
                "decode_seqs",
                "decode_context",
                "client",
                "seconds",
            )
        ),
        pa.field("count", pa.int64(), nullable=False),
    ]
)

_OBS_COLUMNS = (
    "steps",
    "prefill_tokens",
    "prefill_pairs",
    "prefill_seqs",
    "decode_seqs",
    "decode_context",
    "client",
    "seconds",
)


def points_table(rows: list[dict]) -> pa.Table:
    """Rows (dicts keyed by POINTS_SCHEMA names; missing nullable keys → null) as a typed table."""
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in POINTS_SCHEMA} for r in rows], schema=POINTS_SCHEMA)


def steps_table(
    obs: StepObservations, kind: list[str], isl: ArrayLike, concurrency: ArrayLike, count: ArrayLike
) -> pa.Table:
    n = len(obs)
    cols = {
        "kind": pa.array(kind, pa.string()),
        "isl": pa.array(np.broadcast_to(np.asarray(isl, dtype=np.int64), n)),
        "concurrency": pa.array(np.broadcast_to(np.asarray(concurrency, dtype=np.int32), n)),
        **{c: pa.array(getattr(obs, c)) for c in _OBS_COLUMNS},
        "count": pa.array(np.broadcast_to(np.asarray(count, dtype=np.int64), n)),
    }
    return pa.table(cols, schema=STEPS_SCHEMA)


def observations_of(steps: pa.Table) -> StepObservations:
    return StepObservations(*(steps.column(c).to_numpy() for c in _OBS_COLUMNS))


@dataclass(frozen=True)
class Interpolated:
    """Interpolated values; `extrapolated[i]` is True where query i lies outside the measured grid."""

    value: F64
    extrapolated: np.ndarray

    @property
    def any_extrapolated(self) -> bool:
        return bool(self.extrapolated.any())


def _pchip_loglog(x: F64, y: F64, q: F64) -> tuple[F64, np.ndarray]:
    """Monotone interpolation of y(x) in log-log space; linear log-log extension outside, flagged."""
    lx, ly = np.log(x), np.log(np.maximum.accumulate(y))  # more tokens never step faster
    lq = np.log(q)
    out = lq < lx[0]
    out |= lq > lx[-1]
    if lx.size == 1:
        return np.full(q.size, np.exp(ly[0])), lq != lx[0]
    from scipy.interpolate import PchipInterpolator  # here: scipy is slow to import and only profiles interpolate

    inside = np.clip(lq, lx[0], lx[-1])
    v = PchipInterpolator(lx, ly)(inside)
    lo_slope = (ly[1] - ly[0]) / (lx[1] - lx[0])
    hi_slope = (ly[-1] - ly[-2]) / (lx[-1] - lx[-2])
    v = np.where(lq < lx[0], ly[0] + lo_slope * (lq - lx[0]), v)
    v = np.where(lq > lx[-1], ly[-1] + hi_slope * (lq - lx[-1]), v)
    return np.exp(v), out


def interpolate(
    points: pa.Table, metric: str, isl: ArrayLike, concurrency: ArrayLike = 1, x: str = "isl"
) -> Interpolated:
    """`metric` (a POINTS_SCHEMA time column) at (isl, concurrency) from the measured grid; `x` names
    the length axis (`decode_context_mean` to interpolate decode steps by their context)."""
    isl_q, c_q = np.broadcast_arrays(
        np.atleast_1d(np.asarray(isl, dtype=np.float64)), np.atleast_1d(np.asarray(concurrency, dtype=np.float64))
    )
    cols = points.select([x, "concurrency", metric]).to_pandas().dropna().rename(columns={x: "isl"})
    cols = cols[cols[metric] > 0]
    if cols.empty:
        raise ValueError(f"the profile has no measured {metric}")
    grid = cols.groupby(["concurrency", "isl"])[metric].median()
    levels = np.array(sorted(grid.index.get_level_values(0).unique()), dtype=np.float64)
    # per concurrency level: the metric at each queried ISL
    at_level = np.empty((levels.size, isl_q.size))
    out_isl = np.empty((levels.size, isl_q.size), dtype=bool)
    for i, c in enumerate(levels):
        s = grid.loc[c]
        at_level[i], out_isl[i] = _pchip_loglog(s.index.to_numpy(np.float64), s.to_numpy(np.float64), isl_q)
    at_level = np.maximum.accumulate(at_level, axis=0)  # more concurrent sequences never step faster
    value = np.empty(isl_q.size)
    extrapolated = np.empty(isl_q.size, dtype=bool)
    for j in range(isl_q.size):
        ys, flags = at_level[:, j], out_isl[:, j]
        if levels.size == 1:
            value[j], extrapolated[j] = ys[0], flags[0] or c_q[j] != levels[0]
            continue
        v, out_c = _pchip_loglog(levels, ys, c_q[j : j + 1])
        k = int(np.clip(np.searchsorted(levels, c_q[j]), 1, levels.size - 1))
        # linear in log-log between the bracketing levels (PCHIP across few levels overshoots less this way)
        t = (np.log(c_q[j]) - np.log(levels[k - 1])) / (np.log(levels[k]) - np.log(levels[k - 1]))
        value[j] = v[0] if out_c[0] else float(np.exp((1 - t) * np.log(ys[k - 1]) + t * np.log(ys[k])))
        extrapolated[j] = bool(out_c[0] or flags[k - 1] or flags[k])
    return Interpolated(value=value, extrapolated=extrapolated)


class ProfileStepModel:
    """A table-backed `StepTimeModel`: decode steps from the measured table, prefill from the fit.

    A step's decode part is the measured mean step time of `decode_seqs` sequences at their mean
    context, interpolated in the table (monotone, log space; captures a step time that is not
    linear in the batch, as on the CPU engine); prefill chunks add the fitted per-token, per-pair
    and per-sequence costs on top; a step without decodes is the fitted model alone.
    `last_extrapolated` holds the flags of the latest call's decode lookups.
    """

    def __init__(self, points: pa.Table, fit: CalibratedFit) -> None:
        self.points, self.fit = points, fit
        self.last_extrapolated = np.zeros(0, dtype=bool)

    def step_time(self, batch: StepBatch) -> F64:
        linear = self.fit.model
        out = linear.step_time(batch)
        dec = batch.decode_seqs > 0
        flags = np.zeros(len(batch), dtype=bool)
        if dec.any():
            ctx = batch.decode_context[dec] / batch.decode_seqs[dec]
            looked = interpolate(self.points, "itl_mean_s", ctx, batch.decode_seqs[dec], x="decode_context_mean")
            prefill = (
                linear.per_prefill_token_s * batch.prefill_tokens[dec]
                + linear.per_pair_s * batch.prefill_pairs[dec]
                + linear.per_prefill_seq_s * batch.prefill_seqs[dec]
            )
            out[dec] = looked.value + prefill
            flags[dec] = looked.extrapolated
        self.last_extrapolated = flags
        return out


@dataclass(frozen=True)
class Profile:
    """A measured profile: where and what was measured, and what was fitted to it."""

    fingerprint: EnvironmentFingerprint
    points: pa.Table
    steps: pa.Table
    fit: CalibratedFit | None
    manifest: dict

    @property
    def fingerprint_hash(self) -> str:
        return fingerprint_hash(self.fingerprint)

    def interpolate(self, metric: str, isl: ArrayLike, concurrency: ArrayLike = 1) -> Interpolated:
        return interpolate(self.points, metric, isl, concurrency)

    def step_model(self) -> ProfileStepModel:
        if self.fit is None:
            raise ValueError("this profile has no fit (imported tables need one for prefill)")
        return ProfileStepModel(self.points, self.fit)

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        meta = {b"llmcap.fingerprint_hash": self.fingerprint_hash.encode()}
        pq.write_table(self.points.replace_schema_metadata(meta), directory / "points.parquet")
        pq.write_table(self.steps.replace_schema_metadata(meta), directory / "steps.parquet")
        (directory / "fingerprint.json").write_text(
            json.dumps(self.fingerprint.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8"
        )
        if self.fit is not None:
            (directory / "fit.json").write_text(json.dumps(self.fit.to_dict(), indent=2) + "\n", encoding="utf-8")
        manifest = {**self.manifest, "format": FORMAT_VERSION, "fingerprint_hash": self.fingerprint_hash}
        (directory / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
        return directory


def read_fingerprint(directory: Path) -> EnvironmentFingerprint:
    path = directory / "fingerprint.json"
    try:
        return EnvironmentFingerprint.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputFileError(path, "no stored profile fingerprint here") from None
    except ValueError as exc:
        raise InputFileError(path, f"not a valid fingerprint ({exc})") from None


def read_profile(directory: Path) -> Profile:
    fp = read_fingerprint(directory)
    try:
        points = pq.read_table(directory / "points.parquet")
        steps = pq.read_table(directory / "steps.parquet")
        manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputFileError(directory, f"incomplete profile ({exc})") from None
    fit_path = directory / "fit.json"
    fit = CalibratedFit.from_dict(json.loads(fit_path.read_text(encoding="utf-8"))) if fit_path.exists() else None
    if manifest.get("format") != FORMAT_VERSION:
        raise InputFileError(
            directory / "manifest.json", f"profile format {manifest.get('format')!r}, expected {FORMAT_VERSION}"
        )
    return Profile(fp, points.cast(POINTS_SCHEMA), steps.cast(STEPS_SCHEMA), fit, manifest)
