"""`llmcap autoscale --trace FILE --model M --gpu G [--tp N] --slo-ttft-p99 MS ...`: a what-if day served by a
static pool and by autoscaled pools (`llmcap.sizing.autoscale`), simulated, with T_ready and cold caches.

One replica's max feasible rate G comes from `--instance-rps` or from the sizing search on the trace (as
`llmcap size` does for one candidate). The report: GPU-hours and attainment (whole day, worst window) per
plan, and the smallest floor that keeps the attainment target. The results are simulated, not measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from pydantic import ValidationError
from rich.table import Table

from llmcap.catalog import get_gpu, load_model
from llmcap.commands._common import (
    JsonFlagOpt,
    OutputFormatOpt,
    err_console,
    out_console,
    output_format,
    print_csv,
    print_json,
    user_errors,
)
from llmcap.commands._deployment import (
    GpuMemUtilOpt,
    GpuOpt,
    KvBlockSizeOpt,
    KvDtypeOpt,
    MaxBatchedOpt,
    MaxNumSeqsOpt,
    ModelOpt,
    QuantOpt,
    TpOpt,
)
from llmcap.commands._goodput import SLO
from llmcap.commands._trace_input import positive, read_trace_input
from llmcap.deployment import ENGINE, EngineOptions, sim_config, step_model
from llmcap.errors import LlmcapError
from llmcap.report.autoscale import flat_comparison, forecast_lines
from llmcap.report.autoscale import summary as report_summary
from llmcap.sim import AutoscaleConfig
from llmcap.sizing.autoscale import AutoscaleWhatIf, PoolRate, autoscale_whatif
from llmcap.sizing.autoscale_plan import forecast_day
from llmcap.sizing.params import AutoscaleParams, ReadyPhases, SearchParams, SloParams
from llmcap.sizing.search import search_max_rate
from llmcap.sizing.simeval import SimEvaluate
from llmcap.trace import mean_rate

DAY = AutoscaleParams()  # the autoscale stage's knobs: this what-if's defaults where they are the same knob


def _fractions(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise LlmcapError(f"--floor-fractions must be comma-separated numbers, got {text!r}") from None


@user_errors
def autoscale(
    trace: Annotated[
        Path,
        typer.Option("--trace", "-t", help="the request mix: canonical Parquet or any format `llmcap trace` reads"),
    ],
    model: ModelOpt,
    gpu: GpuOpt,
    slo_ttft_p99: Annotated[float, typer.Option("--slo-ttft-p99", min=0.001, help="TTFT target (ms)")],
    slo_itl_p99: Annotated[
        float | None, typer.Option("--slo-itl-p99", min=0.001, help="ITL target (ms), per-request P99")
    ] = None,
    attainment: Annotated[
        float, typer.Option(min=0.01, max=1.0, help="share of requests that must meet every SLO")
    ] = SLO.attainment_target,
    tp: TpOpt = ENGINE.tp,
    quant: QuantOpt = ENGINE.quant,
    kv_dtype: KvDtypeOpt = ENGINE.kv_dtype,
    max_num_seqs: MaxNumSeqsOpt = ENGINE.max_num_seqs,
    max_num_batched_tokens: MaxBatchedOpt = ENGINE.max_num_batched_tokens,
    block_size: KvBlockSizeOpt = ENGINE.block_size,
    gpu_memory_utilization: GpuMemUtilOpt = ENGINE.gpu_memory_utilization,
    instance_rps: Annotated[
        float | None,
        typer.Option("--instance-rps", help="one replica's max feasible rate G (default: searched on the trace)"),
    ] = None,
    mean_rps: Annotated[
        float | None, typer.Option("--mean-rps", help="the day's mean rate, req/s (default: the trace's)")
    ] = None,
    amplitude: Annotated[
        float, typer.Option(min=0.0, max=0.99, help="diurnal swing: rate = mean × (1 + A sin 2πt/period)")
    ] = DAY.amplitude,
    period: Annotated[float, typer.Option("--period", min=1.0, help="diurnal period, s")] = 86_400.0,
    duration: Annotated[float, typer.Option("--duration", min=1.0, help="simulated span, s")] = 86_400.0,
    t_ready: Annotated[
        float | None,
        typer.Option(
            "--t-ready", min=0.0, help="scale-up decision to routable, s (default: the sum of --ready-phases)"
        ),
    ] = DAY.t_ready_s,
    ready_phases: Annotated[
        str,
        typer.Option(
            "--ready-phases",
            help="scale-up phases, s, as NAME=S,... over the defaults (schedule_s, image_pull_s, "
            "weight_load_s, engine_init_s, compile_s, admission_s); T_ready is their sum",
        ),
    ] = "",
    forecast: Annotated[
        str,
        typer.Option(
            "--forecast",
            help="fit: seasonality fitted on a trace of ≥ 2 days (its held-back part is the day); "
            "synthetic: the synthesized day's own curve",
        ),
    ] = DAY.forecast,
    max_total_gpus: Annotated[
        int | None, typer.Option("--max-total-gpus", min=1, help="GPU budget of the autoscaled pool(s)")
    ] = DAY.max_total_gpus,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="autoscaler period, s")] = DAY.interval_s,
    min_residency: Annotated[
        float, typer.Option("--min-residency", min=0.0, help="a replica serves at least this long, s")
    ] = DAY.min_residency_s,
    scale_down_window: Annotated[
        float, typer.Option("--scale-down-window", min=0.0, help="HPA stabilization window, s")
    ] = DAY.scale_down_window_s,
    waiting_target: Annotated[
        float, typer.Option("--waiting-target", min=0.01, help="waiting requests per replica that trigger a scale-up")
    ] = DAY.waiting_per_replica,
    kv_usage_target: Annotated[
        float | None,
        typer.Option(
            "--kv-usage-target", min=0.01, max=1.0, help="KV usage target (default: one replica's at --utilization × G)"
        ),
    ] = None,
    utilization: Annotated[
        float, typer.Option(min=0.05, max=1.0, help="operating point that sets the default KV usage target")
    ] = DAY.utilization,
    forecast_error: Annotated[
        float, typer.Option("--forecast-error", min=0.0, help="the floor's forecast margin (0.1 = 10% above the curve)")
    ] = DAY.forecast_error,
    floor_fractions: Annotated[
        str, typer.Option("--floor-fractions", help="floors tried, as fractions of the full forecast floor")
    ] = "0,0.5,0.75,1",
    seed: Annotated[int, typer.Option(help="seed of the day's synthesis")] = 0,
    output_fmt: OutputFormatOpt = "table",
    json_out: JsonFlagOpt = False,
) -> None:
    """What-if: a diurnal day on a static pool vs autoscaled pools (simulated): GPU-hours, attainment, the floor that keeps it."""
    output = output_format(output_fmt, json_out)
    fractions = _fractions(floor_fractions)
    positive("--mean-rps", mean_rps)
    positive("--instance-rps", instance_rps)
    spec, g = load_model(model), get_gpu(gpu)
    opts = EngineOptions(
        tp=tp,
        quant=quant,
        kv_dtype=kv_dtype,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    engine = sim_config(spec, g, opts).engine
    cleaned = read_trace_input(trace, "auto", "auto", None, None, False, 1.0, "by_id", announce=output == "table")
    source = cleaned.trace
    slo = SloParams(ttft_ms=slo_ttft_p99, itl_ms=slo_itl_p99, attainment_target=attainment)
    step = step_model(model, gpu, tp, quant, kv_dtype)
    if instance_rps is None:
        err_console.print("searching one replica's max feasible rate on the trace ...")
        instance_rps = search_max_rate(
            SimEvaluate(source, step, engine, slo), attainment, SearchParams(seeds=(0,), rel_tol=0.05)
        ).max_rate
        if instance_rps <= 0:
            raise LlmcapError(f"one {spec.name} replica on {g.name} TP{tp} meets the SLOs at no rate: nothing to scale")
    try:
        knobs = AutoscaleParams(
            amplitude=amplitude,
            period_s=period,
            duration_s=duration,
            t_ready_s=t_ready,
            forecast=forecast,  # type: ignore[arg-type]
            ready=ReadyPhases(**_phases(ready_phases)),
            forecast_error=forecast_error,
            max_total_gpus=max_total_gpus,
        )
    except ValidationError as exc:
        raise LlmcapError(
            f"--ready-phases / --forecast: {exc.errors()[0]['loc'][-1]}: {exc.errors()[0]['msg']}"
        ) from None
    day, fitted, flat, note = forecast_day(source, knobs, mean_rps or mean_rate(source))
    if output == "table":
        err_console.print(note)
    running, ready, routable = knobs.ready_points_s
    scaler = AutoscaleConfig(
        t_ready_s=routable,
        pod_running_after_s=running,
        model_ready_after_s=ready,
        interval_s=interval,
        min_residency_s=min_residency,
        scale_down_window_s=scale_down_window,
        waiting_per_replica=waiting_target,
        kv_usage=kv_usage_target,
        max_replicas=10_000,
    )
    w = autoscale_whatif(
        source,
        step,
        engine,
        slo,
        [PoolRate("both", instance_rps, tp)],
        day,
        scaler,
        fractions,
        forecast_error,
        utilization,
        seed=seed,
        on_plan=lambda name: err_console.print(f"simulating the day: {name}"),
        forecast=fitted,
        flat=flat,
        forecast_note=note,
        max_total_gpus=max_total_gpus,
    )
    rows = _rows(w)
    summary = {
        "simulated": True,
        "model": spec.name,
        "gpu": g.name,
        "tp": tp,
        "instance_rps": instance_rps,
        "day": day.to_dict(),
        "reactive_targets": w.reactive_targets["both"],
        "t_ready_s": routable,
        "ready_phases_s": knobs.ready.model_dump(),
        "static_replicas": w.static_counts["both"],
        "plans": rows,
        "floor_that_keeps_attainment": None if w.floor is None else w.floor.floor_fraction,
        "gpu_hours_saved": w.saving,
    } | {k: v for k, v in report_summary(w).items() if k in ("forecast", "scale_up", "max_total_gpus")}
    if output == "json":
        print_json(summary)
        return
    if output == "csv":
        print_csv(rows)
        return
    _print(w, rows)


def _phases(text: str) -> dict[str, float]:
    out = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, _, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise LlmcapError(f"--ready-phases takes NAME=SECONDS items, got {item!r}") from None
    return out


def _rows(w: AutoscaleWhatIf) -> list[dict]:
    return [
        {
            "plan": p.name,
            "floor_fraction": p.floor_fraction,
            "gpu_hours": round(p.gpu_hours, 3),
            "replica_hours": round(p.replica_hours, 3),
            "attainment": round(p.attainment, 5),
            "worst_window_attainment": round(p.worst_window_attainment, 5),
            "peak_replicas": p.peak_replicas,
            "scale_ups": p.scale_ups,
            "keeps_target": p.keeps(w.attainment_target),
        }
        for p in (w.static, *w.autoscaled, *([w.flat] if w.flat else []))
    ]


def _print(w: AutoscaleWhatIf, rows: list[dict]) -> None:
    day = w.day
    rates = ", ".join(f"{q.role if q.role != 'both' else 'replica'} {q.instance_rps:.3g}" for q in w.pools)
    t = Table(title=f"simulated (what-if, not a measurement): {day.describe()}; G per instance: {rates} req/s")
    for col in ("plan", "GPU-hours", "attainment", "worst window", "peak replicas", "scale-ups", "keeps target"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for r in rows:
        t.add_row(
            r["plan"],
            f"{r['gpu_hours']:,.1f}",
            f"{r['attainment']:.4f}",
            f"{r['worst_window_attainment']:.4f}",
            str(r["peak_replicas"]),
            str(r["scale_ups"]),
            "yes" if r["keeps_target"] else "NO",
        )
    console = out_console()
    console.print(t)
    targets = ", ".join(f"{k} {v:.3g}" for t in w.reactive_targets.values() for k, v in t.items())
    counts = ", ".join(f"{role} {n}" for role, n in w.static_counts.items())
    console.print(f"reactive targets: {targets}; static plan: {counts} instances (⌈peak ÷ G⌉).")
    console.print(" ".join(forecast_lines(w)).strip(), highlight=False)
    versus = flat_comparison(w)
    if versus:
        console.print(versus, highlight=False)
    best = w.floor
    if best is None:
        console.print(
            f"no autoscaled plan keeps attainment {w.attainment_target:g}: raise the floor (--floor-fractions) or plan statically"
        )
    else:
        change = (
            f"{w.saving:.1%} fewer"
            if w.saving and w.saving > 0
            else f"{-(w.saving or 0.0):.1%} more: autoscaling does not pay here"
        )
        console.print(
            f"smallest floor that keeps attainment {w.attainment_target:g}: {best.floor_fraction:g} × the forecast floor, "
            f"{best.gpu_hours:,.1f} GPU-hours vs {w.static.gpu_hours:,.1f} static ({change})"
        )
    if np.isclose(w.static.attainment, 0.0):
        console.print("the static plan itself misses: check G (--instance-rps)")
