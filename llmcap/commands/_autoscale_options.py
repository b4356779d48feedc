"""The options of `llmcap autoscale` that are its own (the deployment's are in `_deployment`): the day, the autoscaler
and the floor. Defaults stay in the command's signature, where typer reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

MixTraceOpt = Annotated[
    Path,
    typer.Option("--trace", "-t", help="the request mix: canonical Parquet or any format `llmcap trace` reads"),
]
SloTtftOpt = Annotated[float, typer.Option("--slo-ttft-p99", min=0.001, help="TTFT target (ms)")]
SloItlOpt = Annotated[float | None, typer.Option("--slo-itl-p99", min=0.001, help="ITL target (ms), per-request P99")]
AttainmentOpt = Annotated[float, typer.Option(min=0.01, max=1.0, help="share of requests that must meet every SLO")]
InstanceRpsOpt = Annotated[
    float | None,
    typer.Option("--instance-rps", help="one replica's max feasible rate G (default: searched on the trace)"),
]
MeanRpsOpt = Annotated[
    float | None, typer.Option("--mean-rps", help="the day's mean rate, req/s (default: the trace's)")
]
AmplitudeOpt = Annotated[
    float, typer.Option(min=0.0, max=0.99, help="diurnal swing: rate = mean × (1 + A sin 2πt/period)")
]
PeriodOpt = Annotated[float, typer.Option("--period", min=1.0, help="diurnal period, s")]
DurationOpt = Annotated[float, typer.Option("--duration", min=1.0, help="simulated span, s")]
TReadyOpt = Annotated[
    float | None,
    typer.Option("--t-ready", min=0.0, help="scale-up decision to routable, s (default: the sum of --ready-phases)"),
]
ReadyPhasesOpt = Annotated[
    str,
    typer.Option(
        "--ready-phases",
        help="scale-up phases, s, as NAME=S,... over the defaults (schedule_s, image_pull_s, "
        "weight_load_s, engine_init_s, compile_s, admission_s); T_ready is their sum",
    ),
]
ForecastOpt = Annotated[
    str,
    typer.Option(
        "--forecast",
        help="fit: seasonality fitted on a trace of ≥ 2 days (its held-back part is the day); "
        "synthetic: the synthesized day's own curve",
    ),
]
MaxTotalGpusOpt = Annotated[
    int | None, typer.Option("--max-total-gpus", min=1, help="GPU budget of the autoscaled pool(s)")
]
IntervalOpt = Annotated[float, typer.Option("--interval", min=0.1, help="autoscaler period, s")]
MinResidencyOpt = Annotated[
    float, typer.Option("--min-residency", min=0.0, help="a replica serves at least this long, s")
]
ScaleDownWindowOpt = Annotated[float, typer.Option("--scale-down-window", min=0.0, help="HPA stabilization window, s")]
WaitingTargetOpt = Annotated[
    float, typer.Option("--waiting-target", min=0.01, help="waiting requests per replica that trigger a scale-up")
]
KvUsageTargetOpt = Annotated[
    float | None,
    typer.Option(
        "--kv-usage-target", min=0.01, max=1.0, help="KV usage target (default: one replica's at --utilization × G)"
    ),
]
UtilizationOpt = Annotated[
    float, typer.Option(min=0.05, max=1.0, help="operating point that sets the default KV usage target")
]
ForecastErrorOpt = Annotated[
    float, typer.Option("--forecast-error", min=0.0, help="the floor's forecast margin (0.1 = 10% above the curve)")
]
FloorFractionsOpt = Annotated[
    str, typer.Option("--floor-fractions", help="floors tried, as fractions of the full forecast floor")
]
SeedOpt = Annotated[int, typer.Option(help="seed of the day's synthesis")]
