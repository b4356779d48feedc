"""One replay check: the runs measured against an endpoint (or the unit's digital twin) and predicted by the
simulator, compared bucket by bucket, with attainment per run and the verdict."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from llmcap.config import ReplayParams
from llmcap.perf.model import StepTimeModel
from llmcap.replaycheck.compare import bucket_table, run_summary, verdict
from llmcap.replaycheck.knee import share_knee
from llmcap.replaycheck.runs import RECORD_SCHEMA, Client, Run, measure, plan_runs, predict, run_label
from llmcap.replaycheck.share import Share
from llmcap.replaycheck.twin_process import SERVED_MODEL, serving_twin
from llmcap.replaycheck.unit import PlanUnit
from llmcap.sim import SimConfig
from llmcap.sizing.params import SloParams

TWIN_WARNING = (
    "DIGITAL TWIN: no replay.endpoint is configured, so these 'measured' figures come from llmcap's "
    "simulator served over HTTP (llmcap twin serve), NOT from a real engine. They check the pipeline "
    "and the HTTP path, not the prediction."
)
TRAFFIC = (
    "each run is the share of one window of the trace (on the planning clock, at the run's multiple of the planning "
    "rate) that the router sends one instance: the trace's bursts as one instance meets them, not an excerpt "
    "stretched in time"
)


@dataclass(frozen=True)
class ReplayCheck:
    measured: pa.Table  # RECORD_SCHEMA: every request sent, one row each
    predicted: pa.Table  # RECORD_SCHEMA: the simulator's records of the same requests
    summary: dict[str, Any]


def _by_scale(runs: list[dict[str, Any]], side: str) -> dict[float, list[tuple[int, int]]]:
    """Each scale's runs as (met, judged) steady-window counts, one per seed (every excerpt must hold, as in the
    size stage's search)."""
    out: dict[float, list[tuple[int, int]]] = {}
    for r in runs:
        out.setdefault(r["scale"], []).append((r[side]["met"], r[side]["judged"]))
    return out


def check_replay(
    trace: pa.Table,
    share: Share,
    load: float,
    prediction: tuple[SimConfig, StepTimeModel, StepTimeModel | None],
    endpoint: str,
    model: str,
    params: ReplayParams,
    slo: SloParams,
    *,
    dilation: float = 1.0,
    block_tokens: int | None = None,
    api_key: str | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> ReplayCheck:
    """Replay each seed's runs at each `params.rate_scales` x `load` x the planning rate (`plan_runs`: the unit's
    `share` of a window of the trace) against `endpoint` serving `model`, one after another (open loop;
    `dilation`: wall seconds per simulated second of a time-dilated twin), simulate the same requests with
    `prediction` (config, step model, decode step model), and compare."""
    runs = _runs(trace, share, load, params)
    client = _client(params, dilation, block_tokens, api_key)
    return _check_runs(load, runs, [endpoint] * len(runs), model, prediction, params, slo, client, say)


def _runs(trace: pa.Table, share: Share, load: float, params: ReplayParams) -> list[Run]:
    return plan_runs(trace, share, load, params.rate_scales, params.excerpt_seeds, params.excerpt_requests)


def _client(params: ReplayParams, dilation: float, block_tokens: int | None, api_key: str | None) -> Client:
    return Client(
        dilation=dilation,
        block_tokens=block_tokens,
        vocab_size=params.vocab_size,
        timeout_s=params.timeout_s,
        max_drain_s=params.max_drain_s,
        max_lateness_ms=params.max_lateness_ms,
        api_key=api_key,
    )


def _check_runs(
    load: float,
    runs: list[Run],
    endpoints: list[str],
    model: str,
    prediction: tuple[SimConfig, StepTimeModel, StepTimeModel | None],
    params: ReplayParams,
    slo: SloParams,
    client: Client,
    say: Callable[[str], None],
) -> ReplayCheck:
    """`runs[i]` measured against `endpoints[i]` (`measure`: all at once where each has its own) and predicted."""
    for run in runs:
        say(
            f"run {run.label} (seed {run.seed}): {run.requests.num_rows} requests at {run.rate_rps:.4g} req/s "
            f"({run.traffic})"
        )
    predicted = [predict(run, *prediction) for run in runs]
    measured = measure(runs, endpoints, model, client)
    rows = [
        {
            "run": run.label,
            "scale": run.scale,
            "excerpt_seed": run.seed,
            "rate_rps": run.rate_rps,
            "requests": run.requests.num_rows,
            "traffic": run.traffic,
            "measured": {
                **run_summary(m.records, slo),
                "send_lateness_ms": m.lateness_ms,
                "valid": m.valid,
                "wall_s": m.wall_s,
            },
            "predicted": run_summary(p, slo),
        }
        for run, m, p in zip(runs, measured, predicted, strict=True)
    ]
    measured_t = pa.concat_tables([m.records for m in measured]).cast(RECORD_SCHEMA)
    predicted_t = pa.concat_tables(predicted).cast(RECORD_SCHEMA)
    order = [run_label(s) for s in params.rate_scales]
    # requests_sent counts the schedule, not the rows: the GX suite checks that each has its row
    summary = {
        "load": load,
        "rate_rps": _mean([r.rate_rps for r in runs if r.scale == 1.0]) or _mean([r.rate_rps / r.scale for r in runs]),
        "rate_scales": params.rate_scales,
        "excerpt_seeds": params.excerpt_seeds,
        "excerpt_requests": params.excerpt_requests,
        "traffic": TRAFFIC,
        "attainment_target": slo.attainment_target,
        "dilation": client.dilation,
        "concurrent_runs": len(set(endpoints)) == len(runs) > 1,
        "requests_sent": sum(r.requests.num_rows for r in runs),
        "runs": rows,
        "valid": all(r["measured"]["valid"] for r in rows),
        "verdict": {
            "measured": verdict(
                _by_scale(rows, "measured"),
                slo.attainment_target,
                invalid=[r["run"] for r in rows if not r["measured"]["valid"]],
            ),
            "predicted": verdict(_by_scale(rows, "predicted"), slo.attainment_target),
        },
        "buckets": bucket_table(measured_t, predicted_t, params.isl_buckets, params.osl_buckets, order),
        "itl_definition": "per-request mean inter-token gap (TPOT), percentiles over the bucket's ok requests",
    }
    return ReplayCheck(measured_t, predicted_t, summary)


def check_unit(
    unit: PlanUnit,
    trace: pa.Table,
    params: ReplayParams,
    slo: SloParams,
    *,
    model: str | None = None,
    block_tokens: int | None = None,
    api_key: str | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> ReplayCheck:
    """The plan's unit replayed on its share of the trace (`unit.share`: as the plan's router sends it one
    instance), at `params.rate_scales` x the load where the simulator predicts the unit stops holding that share
    (`share_knee`), against `params.endpoint` serving `model` (its runs one after another), or, with no endpoint,
    against the unit's digital twin: one twin per run, started for the check and replayed all at once
    (time-dilated by `params.twin_dilation`; each stopped by its PID afterwards). The prediction is `unit.simulation()`: the
    config and roofline step models the twin serves."""
    prediction = unit.simulation()
    head: dict[str, Any] = {
        "unit": {
            "chosen": unit.chosen,
            "mode": unit.mode,
            "description": unit.describe(),
            "rate_rps": unit.rate_rps,
            "rate_basis": unit.rate_basis,
            "planning_rps": unit.planning_rps,
        }
    }
    share = unit.share(trace)
    knee = share_knee(trace, share, prediction, params, slo)
    head |= {"knee": {"load": knee.load, "rate_rps": knee.rate_rps, "held": knee.held, "basis": knee.basis}}
    say(f"bracketing {knee.load:.3g}x the planning rate ({knee.rate_rps:.4g} req/s to the unit): {knee.basis}")
    if params.endpoint is None:
        args = unit.twin_args() + (["--slowdown", repr(params.twin_slowdown)] if params.twin_slowdown != 1.0 else [])
        runs = _runs(trace, share, knee.load, params)
        say(
            f"no replay.endpoint: serving the unit's DIGITAL TWIN, one per run ({len(runs)}), all at once "
            f"(llmcap twin serve {' '.join(args)}, dilation {params.twin_dilation:g})"
        )
        with ExitStack() as twins:
            urls = [twins.enter_context(serving_twin(args, params.twin_dilation)) for _ in runs]
            client = _client(params, params.twin_dilation, block_tokens, None)
            check = _check_runs(knee.load, runs, urls, SERVED_MODEL, prediction, params, slo, client, say)
        head |= {"source": "digital-twin", "warning": TWIN_WARNING, "twin_command": ["llmcap", "twin", "serve", *args]}
    else:
        if model is None:
            raise ValueError("an endpoint needs the served model name")
        check = check_replay(
            trace,
            share,
            knee.load,
            prediction,
            params.endpoint,
            model,
            params,
            slo,
            block_tokens=block_tokens,
            api_key=api_key,
            say=say,
        )
        head |= {"source": "endpoint", "warning": None}
    return ReplayCheck(check.measured, check.predicted, head | check.summary)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
