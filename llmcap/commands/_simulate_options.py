"""`llmcap simulate`'s own options, declared once (the deployment's options live in `_deployment`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SimTraceOpt = Annotated[
    Path, typer.Option("--trace", "-t", help="trace file: canonical Parquet or any format `llmcap trace` reads")
]

SimModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="catalog model name or path to config.json")]

SimGpuOpt = Annotated[str | None, typer.Option("--gpu", "-g", help="GPU name or alias (e.g. h100)")]

PlanFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--plan",
        help="replay a sized plan instead (summary.json of `llmcap size --out` or the size "
        "stage): its deployment, step times, planning rate, seed and SLO; exit 6 (SLO MISSED) when it misses",
    ),
]

ScenarioOpt = Annotated[
    str | None,
    typer.Option(
        "--scenario",
        help="with --plan: serve only what one of its scenarios leaves, e.g. "
        "'node loss: prefill' (default: every planned instance)",
    ),
]

SimEngineOpt = Annotated[
    str | None,
    typer.Option(
        "--engine",
        help="vllm | sglang | trtllm: that engine's own defaults on --gpu for "
        "the admission policy, chunk, max batch and KV block; an option given explicitly wins",
    ),
]

RequestRateOpt = Annotated[
    float | None,
    typer.Option("--request-rate", help="simulate at this mean rate, req/s (the trace's burst shape kept)"),
]

RateScaleOpt = Annotated[
    float, typer.Option(help="or: multiply the trace's mean arrival rate by this (gaps shrink by it)")
]

RouterSeedOpt = Annotated[int, typer.Option(help="seed of the power-of-two router")]

ResolutionOpt = Annotated[float, typer.Option(min=1e-6, help="time-series resolution, s")]

MaxTimeOpt = Annotated[float | None, typer.Option(min=0.0, help="stop the simulated clock here, s")]

ReferenceOpt = Annotated[bool, typer.Option("--reference", help="step-by-step reference mode (slow)")]

RecordsOutOpt = Annotated[Path | None, typer.Option("--out", help="write per-request records (Parquet)")]

TimeseriesOutOpt = Annotated[
    Path | None, typer.Option("--timeseries-out", help="write per-replica time series (Parquet)")
]
