"""Outputs of a run: the per-request table, the token-weighted ITL distribution, per-replica time
series and the summary."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from llmcap.sim.cluster import ClusterRun
from llmcap.sim.histogram import HIST_BINS_PER_DECADE, HIST_MIN_S, itl_histogram
from llmcap.sim.recorder import OK, STATUS_NAMES
from llmcap.sim.records import REQUEST_SCHEMA
from llmcap.sim.state import INF

TIMESERIES_SCHEMA = pa.schema(
    [
        pa.field("replica", pa.int32(), nullable=False),
        pa.field("role", pa.string(), nullable=False),
        pa.field("t_s", pa.float64(), nullable=False),  # bin start; gauges are sampled here
        pa.field("running", pa.int32(), nullable=False),
        pa.field("waiting", pa.int32(), nullable=False),
        pa.field("kv_used_blocks", pa.int64(), nullable=False),
        pa.field("kv_usage", pa.float64(), nullable=False),
        pa.field("tokens", pa.int64(), nullable=False),  # tokens computed by steps ending in the bin
        pa.field("steps", pa.int64(), nullable=False),
        pa.field("prefix_hit_tokens", pa.int64(), nullable=False),
        pa.field("preemptions", pa.int64(), nullable=False),
        pa.field("finished", pa.int64(), nullable=False),
    ]
)


def _col(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    return pa.array(values, type=typ, mask=np.isnan(values))


def records_table(
    run: ClusterRun, request_id: np.ndarray, arrival: np.ndarray, isl: np.ndarray, osl: np.ndarray, pd: bool
) -> pa.Table:
    r = run.recorder
    f64 = pa.float64()
    prefilled = ~np.isnan(r.prefill_done)
    transfer = r.transfer if pd else np.where(prefilled, 0.0, np.nan)
    visible = (r.decode_admitted - r.prefill_done) if pd else np.where(prefilled, 0.0, np.nan)
    osl_f = osl.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(osl > 1, (r.finish - r.first_token) / (osl_f - 1.0), np.nan)
    cols = {
        "request_id": pa.array(request_id, pa.int64()),
        "arrival_s": pa.array(arrival, f64),
        "admitted_s": _col(r.admitted, f64),
        "first_token_s": _col(r.first_token, f64),
        "finish_s": _col(r.finish, f64),
        "isl": pa.array(isl, pa.int64()),
        "osl": pa.array(osl, pa.int64()),
        "cached_tokens": pa.array(r.cached, pa.int64()),
        "host_cached_tokens": pa.array(r.host_cached, pa.int64()),
        "preemptions": pa.array(r.preemptions, pa.int32()),
        "prefill_replica": pa.array(r.prefill_replica, pa.int32(), mask=r.prefill_replica < 0),
        "decode_replica": pa.array(r.decode_replica, pa.int32(), mask=r.decode_replica < 0),
        "queue_s": _col(r.admitted - arrival, f64),
        "prefill_s": _col(r.prefill_done - r.admitted, f64),
        "transfer_s": _col(transfer, f64),
        "visible_wait_s": _col(visible, f64),
        "decode_s": _col(r.finish - r.first_token, f64),
        "ttft_s": _col(r.first_token - arrival, f64),
        "tpot_s": _col(tpot, f64),
        "e2e_s": _col(r.finish - arrival, f64),
        "itl_p50_s": _col(r.itl_p50, f64),
        "itl_p99_s": _col(r.itl_p99, f64),
        "itl_max_s": _col(r.itl_max, f64),
        "status": pa.array(np.array(STATUS_NAMES, dtype=object)[r.status], pa.string()),
    }
    return pa.Table.from_pydict(cols, schema=REQUEST_SCHEMA)


def itl_distribution(run: ClusterRun) -> tuple[np.ndarray, np.ndarray]:
    """Every inter-token gap as exact (value, weight) pairs: one pair per engine step (its duration,
    weighted by the decodes whose previous token ended the step before), plus one per irregular gap
    (the first token after a recompute or a handoff)."""
    durations: list[np.ndarray] = []  # every exact replica's step-log chunks, joined once
    weights: list[np.ndarray] = []
    hist = None
    for rep in run.replicas:
        if rep.hist is not None:
            d, w = rep.step_log()
            h = rep.hist + itl_histogram(d, w)
            hist = h if hist is None else hist + h
            continue
        durations += rep.chunk_d
        weights += rep.chunk_w
    extra = np.asarray(run.recorder.extra_gaps, dtype=np.float64)
    if hist is not None:  # histogram mode: (geometric bin centre, tokens) for every non-empty bin
        hist = hist + itl_histogram(extra, np.ones(extra.size, dtype=np.int64))
        nz = np.flatnonzero(hist)
        centre = HIST_MIN_S * 10.0 ** ((nz + 0.5) / HIST_BINS_PER_DECADE)
        return centre, hist[nz]
    values = np.concatenate([*durations, extra])
    counts = np.concatenate([*weights, np.ones(extra.size, dtype=np.int64)])
    keep = counts > 0
    return values[keep], counts[keep]


_SELECT_MIN = 1 << 14  # below this many values one sort is cheap
_SELECT_BINS = 1 << 12


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs: list[float]) -> list[float]:
    """Inverted-CDF quantiles of a weighted sample: the smallest value whose cumulative weight reaches q·W.

    Exact without sorting everything (a run's ITL distribution has one value per engine step, millions):
    see `_select`. Same numbers as sorting the whole sample (tests/sim/test_quantiles.py)."""
    total = float(weights.sum())
    if values.size == 0 or total == 0:
        return [float("nan")] * len(qs)
    return _select(values, weights, [q * total for q in qs], 0.0)


def _select(values: np.ndarray, weights: np.ndarray, targets: list[float], below: float) -> list[float]:
    """For each target cumulative weight, the smallest value whose cumulative weight reaches it; `below`
    is the weight of the rest of the sample that lies under these values. Values go into bins by a
    monotone map (floor of a linear rescale: every value of a lower bin is <= every value of a higher
    one); the bins' cumulative weights find the bin a target falls in, and the search repeats inside it
    until few values are left to sort. Weights are integers, so every partial sum is exact in float64."""
    lo, hi = float(values.min()), float(values.max())
    scale = (_SELECT_BINS - 1) / (hi - lo) if hi > lo else 0.0
    if values.size < _SELECT_MIN or not 0.0 < scale < INF:
        order = np.argsort(values)  # ties hold equal values: any order among them gives the same quantile
        v, cw = values[order], below + np.cumsum(weights[order], dtype=np.float64)
        return [float(v[min(int(np.searchsorted(cw, t, side="left")), v.size - 1)]) for t in targets]
    bins = ((values - lo) * scale).astype(np.int64)  # min in bin 0, max in the last: every level splits
    cum = below + np.cumsum(np.bincount(bins, weights=weights, minlength=_SELECT_BINS))
    out = []
    for t in targets:
        k = min(int(np.searchsorted(cum, t, side="left")), _SELECT_BINS - 1)
        inside = bins == k
        out += _select(values[inside], weights[inside], [t], float(cum[k - 1]) if k else below)
    return out


def timeseries_table(run: ClusterRun) -> pa.Table:
    """Every replica's sampled gauges and per-bin counters, one replica after another, built as one table."""
    samples, finals, replica, start, res, blocks, roles = [], [], [], [], [], [], []
    for rep in run.replicas:
        ts = np.frombuffer(rep.ts, dtype=np.int64).reshape(-1, 8)
        if ts.shape[0] == 0:
            continue
        samples.append(ts)
        finals.append(np.array(rep.state_at(run.end_s), dtype=np.int64))
        replica.append(rep.index)
        start.append(rep.grid_i - ts.shape[0])  # (an autoscaled replica's grid starts when it was asked for)
        res.append(rep.res)
        blocks.append(rep.kv.num_blocks)
        roles.append(rep.role)
    if not samples:
        return TIMESERIES_SCHEMA.empty_table()
    rows = np.array([len(ts) for ts in samples])
    ts = np.concatenate(samples)
    # cumulative counters -> per bin: each replica's next sample (its final state after its last one)
    nxt = np.empty_like(ts[:, 3:])
    nxt[:-1] = ts[1:, 3:]
    last = np.cumsum(rows) - 1
    nxt[last] = np.stack(finals)[:, 3:]
    counts = nxt - ts[:, 3:]
    names = sorted(set(roles))  # the role column as codes into its few names
    cols = {
        "replica": np.repeat(np.array(replica, dtype=np.int32), rows),
        "role": pa.DictionaryArray.from_arrays(np.repeat([names.index(r) for r in roles], rows), names).cast(
            pa.string()
        ),
        "t_s": np.concatenate([np.arange(s, s + n) * r for s, n, r in zip(start, rows.tolist(), res, strict=True)]),
        "running": ts[:, 0].astype(np.int32),
        "waiting": ts[:, 1].astype(np.int32),
        "kv_used_blocks": ts[:, 2].copy(),
        "kv_usage": ts[:, 2] / np.repeat(np.array(blocks), rows),
        "tokens": counts[:, 0],
        "steps": counts[:, 1],
        "prefix_hit_tokens": counts[:, 2],
        "preemptions": counts[:, 3],
        "finished": counts[:, 4],
    }
    return pa.Table.from_pydict(cols, schema=TIMESERIES_SCHEMA)


def _pcts(x: np.ndarray, scale: float = 1e3) -> dict[str, float | None]:
    if x.size == 0:
        return {"p50": None, "p90": None, "p99": None}
    p = np.percentile(x, [50, 90, 99]) * scale
    return {"p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2])}


def prefix_tiers(run: ClusterRun, prompt_tokens: int) -> list[dict]:
    """Per offload tier, over every replica: prompt tokens loaded from it instead of computed (and their share
    of all prompt tokens), the seconds spent loading them, and the lookups made there and their seconds."""
    out: dict[str, dict] = {}
    for rep in run.replicas:
        for level, tier in enumerate(rep.cfg.offload_tiers() if rep.caching else ()):
            t = out.setdefault(
                tier.name, {"tier": tier.name, "hit_tokens": 0, "load_s": 0.0, "lookups": 0, "lookup_s": 0.0}
            )
            t["hit_tokens"] += rep.tier_hit_tokens[level]
            t["load_s"] += rep.tier_load_s[level]
            t["lookups"] += rep.tier_lookups[level]
            t["lookup_s"] += rep.tier_lookups[level] * tier.lookup_s
    for t in out.values():
        t["hit_ratio"] = t["hit_tokens"] / prompt_tokens if prompt_tokens else 0.0
    return list(out.values())


def summary(records: pa.Table, itl: tuple[np.ndarray, np.ndarray], run: ClusterRun, wall_s: float) -> dict:
    r = run.recorder
    ok = r.status == OK
    n = int(r.status.size)
    arrival = records.column("arrival_s").to_numpy()
    finish = r.finish[ok]
    start = float(arrival.min()) if n else 0.0
    duration = float(finish.max() - start) if finish.size else 0.0
    osl = records.column("osl").to_numpy()
    isl = records.column("isl").to_numpy()

    def col(name: str) -> np.ndarray:
        return records.column(name).to_numpy(zero_copy_only=False).astype(np.float64)[ok]

    tpot = col("tpot_s")
    itl_ms = weighted_quantiles(itl[0], itl[1], [0.5, 0.9, 0.99])
    sim_s = run.end_s - start
    tiers = prefix_tiers(run, int(isl.sum()))
    out = {
        "requests": n,
        "completed": int(ok.sum()),
        "rejected": int((r.status == 2).sum()),
        "unfinished": int((r.status == 1).sum()),
        "duration_s": duration,
        "ttft_ms": _pcts(col("ttft_s")),
        "itl_ms": {
            k: (v * 1e3 if np.isfinite(v) else None) for k, v in zip(("p50", "p90", "p99"), itl_ms, strict=True)
        },
        "tpot_ms": _pcts(tpot[~np.isnan(tpot)]),
        "e2e_ms": _pcts(col("e2e_s")),
        "throughput": {
            "output_tok_s": float(osl[ok].sum() / duration) if duration > 0 else None,
            "req_s": float(ok.sum() / duration) if duration > 0 else None,
        },
        "preemptions": int(r.preemptions.sum()),
        "prefix_hit_ratio": float(r.cached.sum() / isl.sum()) if isl.sum() else 0.0,
        "wall_s": wall_s,
        "requests_per_wall_s": n / wall_s if wall_s > 0 else None,
        "simulated_s_per_wall_s": sim_s / wall_s if wall_s > 0 else None,
    }
    if tiers:
        out["prefix_tiers"] = tiers
    return out


def _scale_up_point(asked: np.ndarray, ready: np.ndarray, stopped: np.ndarray, after_s: float | None) -> np.ndarray:
    """When each replica reached a scale-up point `after_s` past its ask: 0 for those ready at the start, NaN where the
    point is not known or the replica was cancelled before it."""
    if after_s is None:
        return np.where(ready == 0.0, 0.0, np.nan)
    at = np.where(ready == 0.0, 0.0, asked + after_s)
    return np.where(np.isnan(stopped) | (stopped >= at), at, np.nan)


def autoscale_tables(run: ClusterRun) -> tuple[pa.Table, pa.Table]:
    """An autoscaled run's control ticks per pool (what its autoscaler saw and asked for) and its replicas' lives:
    asked for (the target replica set), its pod running and its model ready (the config's offsets: reported, not
    simulated), routable (the router admits it), stopped taking requests, and released (stopped and drained of its last request — a
    prefill replica's last handoff sent —, or the run's end while still serving). `held_s` (released − asked)
    is what the replica's GPUs cost, its start-up included. `pool`: "both" (aggregated), "prefill", "decode"."""
    rec = run.recorder
    ticks, lives = [], []
    for pool in run.scaled:
        k = pool.scaler.ticks
        ticks.append(
            pa.table(
                {
                    "pool": pa.array([pool.role] * len(k), pa.string()),
                    "t_s": pa.array([x.t for x in k], pa.float64()),
                    "ready": pa.array([x.ready for x in k], pa.int32()),
                    "starting": pa.array([x.starting for x in k], pa.int32()),
                    "waiting_avg": pa.array([x.waiting_avg for x in k], pa.float64()),
                    "kv_usage_avg": pa.array([x.kv_usage_avg for x in k], pa.float64()),
                    "running_avg": pa.array([x.running_avg for x in k], pa.float64()),
                    "floor": pa.array([x.floor for x in k], pa.int32()),
                    "reactive": pa.array([x.reactive for x in k], pa.int32()),
                    "target": pa.array([x.target for x in k], pa.int32()),
                }
            )
        )
        n = len(pool.members)
        served = rec.decode_replica if pool.role == "decode" else rec.prefill_replica
        done = rec.prefill_done + rec.transfer if pool.role == "prefill" else rec.finish
        done = np.where(np.isnan(done), -np.inf, done)
        last = np.full(n, -np.inf)
        np.maximum.at(last, served[served >= 0], done[served >= 0])
        stopped = np.array(pool.stopped_s, dtype=np.float64)
        released = np.where(np.isnan(stopped), run.end_s, np.maximum(stopped, last))
        asked = np.array(pool.asked_s, dtype=np.float64)
        ready = np.array(pool.ready_s, dtype=np.float64)
        cfg = pool.scaler.cfg
        running_s, model_ready_s = (
            _scale_up_point(asked, ready, stopped, cfg.pod_running_after_s),
            _scale_up_point(asked, ready, stopped, cfg.model_ready_after_s),
        )
        lives.append(
            pa.table(
                {
                    "pool": pa.array([pool.role] * n, pa.string()),
                    "replica": pa.array(np.arange(n), pa.int32()),
                    "asked_s": pa.array(asked, pa.float64()),
                    "running_s": _col(running_s, pa.float64()),
                    "model_ready_s": _col(model_ready_s, pa.float64()),
                    "ready_s": _col(ready, pa.float64()),
                    "stopped_s": _col(stopped, pa.float64()),
                    "released_s": pa.array(released, pa.float64()),
                    "held_s": pa.array(released - asked, pa.float64()),
                }
            )
        )
    return pa.concat_tables(ticks), pa.concat_tables(lives)
