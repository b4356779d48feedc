"""`llmcap autoscale --trace FILE --model M --gpu G [--tp N] --slo-ttft-p99 MS ...`: a what-if day served by a
static pool and by autoscaled pools (`llmcap.sizing.autoscale_whatif`), simulated, with T_ready and cold caches.

One replica's max feasible rate G comes from `--instance-rps` or from the sizing search on the trace (as
`llmcap size` does for one candidate). The report: GPU-hours and attainment (whole day, worst window) per
plan, and the smallest floor that keeps the attainment target. The results are simulated, not measured.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import ValidationError
from rich.table import Table

from llmcap.catalog import GpuSpec, ModelSpec, get_gpu, load_model
from llmcap.commands._autoscale_options import (
    AmplitudeOpt,
    AttainmentOpt,
    DurationOpt,
    FloorFractionsOpt,
    ForecastErrorOpt,
    ForecastOpt,
    InstanceRpsOpt,
    IntervalOpt,
    KvUsageTargetOpt,
    MaxTotalGpusOpt,
    MeanRpsOpt,
    MinResidencyOpt,
    MixTraceOpt,
    PeriodOpt,
    ReadyPhasesOpt,
    ScaleDownWindowOpt,
    SeedOpt,
    SloItlOpt,
    SloTtftOpt,
    TReadyOpt,
    UtilizationOpt,
    WaitingTargetOpt,
)
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
from llmcap.perf.model import StepTimeModel
from llmcap.report.autoscale_whatif import flat_comparison, forecast_lines
from llmcap.report.autoscale_whatif import summary as report_summary
from llmcap.sim import AutoscaleConfig, EngineConfig
from llmcap.sizing.autoscale_plan import forecast_day
from llmcap.sizing.autoscale_whatif import AutoscaleWhatIf, PoolRate, autoscale_whatif
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
    trace: MixTraceOpt,
    model: ModelOpt,
    gpu: GpuOpt,
    slo_ttft_p99: SloTtftOpt,
    slo_itl_p99: SloItlOpt = None,
    attainment: AttainmentOpt = SLO.attainment_target,
    tp: TpOpt = ENGINE.tp,
    quant: QuantOpt = ENGINE.quant,
    kv_dtype: KvDtypeOpt = ENGINE.kv_dtype,
    max_num_seqs: MaxNumSeqsOpt = ENGINE.max_num_seqs,
    max_num_batched_tokens: MaxBatchedOpt = ENGINE.max_num_batched_tokens,
    block_size: KvBlockSizeOpt = ENGINE.block_size,
    gpu_memory_utilization: GpuMemUtilOpt = ENGINE.gpu_memory_utilization,
    instance_rps: InstanceRpsOpt = None,
    mean_rps: MeanRpsOpt = None,
    amplitude: AmplitudeOpt = DAY.amplitude,
    period: PeriodOpt = 86_400.0,
    duration: DurationOpt = 86_400.0,
    t_ready: TReadyOpt = DAY.t_ready_s,
    ready_phases: ReadyPhasesOpt = "",
    forecast: ForecastOpt = DAY.forecast,
    max_total_gpus: MaxTotalGpusOpt = DAY.max_total_gpus,
    interval: IntervalOpt = DAY.interval_s,
    min_residency: MinResidencyOpt = DAY.min_residency_s,
    scale_down_window: ScaleDownWindowOpt = DAY.scale_down_window_s,
    waiting_target: WaitingTargetOpt = DAY.waiting_per_replica,
    kv_usage_target: KvUsageTargetOpt = None,
    utilization: UtilizationOpt = DAY.utilization,
    forecast_error: ForecastErrorOpt = DAY.forecast_error,
    floor_fractions: FloorFractionsOpt = "0,0.5,0.75,1",
    seed: SeedOpt = 0,
    output_fmt: OutputFormatOpt = "table",
    json_out: JsonFlagOpt = False,
) -> None:
    """What-if: a diurnal day on a static pool vs autoscaled pools (simulated): GPU-hours, attainment, the floor that keeps it."""
    output = output_format(output_fmt, json_out)
    fractions = _fractions(floor_fractions)
    positive("--mean-rps", mean_rps)
    positive("--instance-rps", instance_rps)
    spec, g = load_model(model), get_gpu(gpu)
    engine = _engine(
        spec, g, tp, quant, kv_dtype, max_num_seqs, max_num_batched_tokens, block_size, gpu_memory_utilization
    )
    source = read_trace_input(trace, "auto", "auto", None, None, False, 1.0, "by_id", announce=output == "table").trace
    slo = SloParams(ttft_ms=slo_ttft_p99, itl_ms=slo_itl_p99, attainment_target=attainment)
    step = step_model(model, gpu, tp, quant, kv_dtype)
    if instance_rps is None:
        instance_rps = _searched_rate(source, step, engine, slo, f"one {spec.name} replica on {g.name} TP{tp}")
    knobs = _knobs(amplitude, period, duration, t_ready, forecast, ready_phases, forecast_error, max_total_gpus)
    day, fitted, flat, note = forecast_day(source, knobs, mean_rps or mean_rate(source))
    if output == "table":
        err_console.print(note)
    scaler = _scaler(knobs, interval, min_residency, scale_down_window, waiting_target, kv_usage_target)
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
    summary = _summary(w, rows, knobs, {"model": spec.name, "gpu": g.name, "tp": tp, "instance_rps": instance_rps})
    if output == "json":
        print_json(summary)
    elif output == "csv":
        print_csv(rows)
    else:
        _print(w, rows)


def _engine(
    spec: ModelSpec,
    gpu: GpuSpec,
    tp: int,
    quant: str,
    kv_dtype: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    block_size: int,
    gpu_memory_utilization: float,
) -> EngineConfig:
    """One replica's engine as `llmcap simulate` builds it from the same options."""
    opts = EngineOptions(
        tp=tp,
        quant=quant,
        kv_dtype=kv_dtype,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    return sim_config(spec, gpu, opts).engine


def _scaler(
    knobs: AutoscaleParams,
    interval: float,
    min_residency: float,
    scale_down_window: float,
    waiting_target: float,
    kv_usage_target: float | None,
) -> AutoscaleConfig:
    """The autoscaler: a new pod's readiness from `knobs`, its loop and targets from the options."""
    running, ready, routable = knobs.ready_points_s
    return AutoscaleConfig(
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


def _searched_rate(source: pa.Table, step: StepTimeModel, engine: EngineConfig, slo: SloParams, what: str) -> float:
    """One replica's max feasible rate G, searched on the trace (`what` names the replica when it has none)."""
    err_console.print("searching one replica's max feasible rate on the trace ...")
    rate = search_max_rate(
        SimEvaluate(source, step, engine, slo), slo.attainment_target, SearchParams(seeds=(0,), rel_tol=0.05)
    ).max_rate
    if rate <= 0:
        raise LlmcapError(f"{what} meets the SLOs at no rate: nothing to scale")
    return rate


def _knobs(
    amplitude: float,
    period: float,
    duration: float,
    t_ready: float | None,
    forecast: str,
    ready_phases: str,
    forecast_error: float,
    max_total_gpus: int | None,
) -> AutoscaleParams:
    """The day's and the scale-up's knobs as the autoscale stage takes them (`AutoscaleParams`), validated."""
    try:
        return AutoscaleParams(
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


def _summary(w: AutoscaleWhatIf, rows: list[dict], knobs: AutoscaleParams, replica: dict[str, Any]) -> dict[str, Any]:
    """The JSON output: the replica (model, GPU, TP, G), the day, the targets and every plan's row."""
    return {
        "simulated": True,
        **replica,
        "day": w.day.to_dict(),
        "reactive_targets": w.reactive_targets["both"],
        "t_ready_s": knobs.ready_points_s[2],
        "ready_phases_s": knobs.ready.model_dump(),
        "static_replicas": w.static_counts["both"],
        "plans": rows,
        "floor_that_keeps_attainment": None if w.floor is None else w.floor.floor_fraction,
        "gpu_hours_saved": w.saving,
    } | {k: v for k, v in report_summary(w).items() if k in ("forecast", "scale_up", "max_total_gpus")}


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
