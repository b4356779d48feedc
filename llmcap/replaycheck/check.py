"""One replay check: the runs measured against an endpoint (or the unit's digital twin) and predicted by the
simulator, compared bucket by bucket, with attainment per run and the verdict."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from llmcap.config import ReplayParams
from llmcap.perf.model import StepTimeModel
from llmcap.replaycheck.compare import bucket_table, run_summary, verdict
from llmcap.replaycheck.runs import RECORD_SCHEMA, measure, plan_runs, predict, run_label
from llmcap.replaycheck.twin_process import SERVED_MODEL, serving_twin
from llmcap.replaycheck.unit import PlanUnit
from llmcap.sim import SimConfig
from llmcap.sizing.params import SloParams

TWIN_WARNING = (
    "DIGITAL TWIN: no replay.endpoint is configured, so these 'measured' figures come from llmcap's "
    "simulator served over HTTP (llmcap twin serve), NOT from a real engine. They check the pipeline "
    "and the HTTP path, not the prediction."
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
    rate_rps: float,
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
    """Replay each seed's excerpt at each `params.rate_scales` x `rate_rps` against `endpoint` serving `model`
    (open loop; `dilation`: wall seconds per simulated second of a time-dilated twin), simulate the same
    requests with `prediction` (config, step model, decode step model), and compare."""
    runs = plan_runs(trace, rate_rps, params.rate_scales, params.excerpt_seeds, params.excerpt_requests)
    measured, predicted = [], []
    rows: list[dict[str, Any]] = []
    for run in runs:
        say(f"run {run.label} (seed {run.seed}): {run.requests.num_rows} requests at {run.rate_rps:.4g} req/s")
        p = predict(run, *prediction)
        m = measure(
            run,
            endpoint,
            model,
            dilation=dilation,
            block_tokens=block_tokens,
            vocab_size=params.vocab_size,
            timeout_s=params.timeout_s,
            max_drain_s=params.max_drain_s,
            max_lateness_ms=params.max_lateness_ms,
            api_key=api_key,
        )
        measured.append(m.records)
        predicted.append(p)
        rows.append(
            {
                "run": run.label,
                "scale": run.scale,
                "excerpt_seed": run.seed,
                "rate_rps": run.rate_rps,
                "measured": {
                    **run_summary(m.records, slo),
                    "send_lateness_ms": m.lateness_ms,
                    "valid": m.valid,
                    "wall_s": m.wall_s,
                },
                "predicted": run_summary(p, slo),
            }
        )
    measured_t = pa.concat_tables(measured).cast(RECORD_SCHEMA)
    predicted_t = pa.concat_tables(predicted).cast(RECORD_SCHEMA)
    order = [run_label(s) for s in params.rate_scales]
    # requests_sent counts the schedule, not the rows: the GX suite checks that each has its row
    summary = {
        "rate_rps": rate_rps,
        "rate_scales": params.rate_scales,
        "excerpt_seeds": params.excerpt_seeds,
        "excerpt_requests": params.excerpt_requests,
        "attainment_target": slo.attainment_target,
        "dilation": dilation,
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
    """`check_replay` of the plan's unit at its predicted rate against `params.endpoint` serving `model`, or,
    with no endpoint, against the unit's digital twin started for the check (time-dilated by
    `params.twin_dilation`; stopped by its PID afterwards). The prediction is `unit.simulation()`: the
    config and roofline step models the twin serves."""
    prediction = unit.simulation()
    head: dict[str, Any] = {
        "unit": {
            "chosen": unit.chosen,
            "mode": unit.mode,
            "description": unit.describe(),
            "rate_rps": unit.rate_rps,
            "rate_basis": unit.rate_basis,
        }
    }
    if params.endpoint is None:
        args = unit.twin_args() + (["--slowdown", repr(params.twin_slowdown)] if params.twin_slowdown != 1.0 else [])
        say(
            f"no replay.endpoint: serving the unit's DIGITAL TWIN (llmcap twin serve {' '.join(args)}, dilation {params.twin_dilation:g})"
        )
        with serving_twin(args, params.twin_dilation) as url:
            check = check_replay(
                trace,
                unit.rate_rps,
                prediction,
                url,
                SERVED_MODEL,
                params,
                slo,
                dilation=params.twin_dilation,
                block_tokens=block_tokens,
                say=say,
            )
        head |= {"source": "digital-twin", "warning": TWIN_WARNING, "twin_command": ["llmcap", "twin", "serve", *args]}
    else:
        if model is None:
            raise ValueError("an endpoint needs the served model name")
        check = check_replay(
            trace,
            unit.rate_rps,
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
