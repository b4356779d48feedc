"""The sized plan's deployment on a diurnal day: static vs autoscaled (`llmcap.sizing.autoscale_whatif`), from what the
size step decided (its capacity summary) and the same candidate rows, step models and router it used."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pandas as pd
import pyarrow as pa

from llmcap.catalog import ModelSpec
from llmcap.errors import LlmcapError
from llmcap.first_token import first_token_from
from llmcap.sim import AutoscaleConfig, LinkConfig, PDConfig
from llmcap.sizing.autoscale_whatif import AutoscaleWhatIf, Day, DiurnalDay, PoolRate, TraceDay, autoscale_whatif
from llmcap.sizing.forecast import Forecast, fit_seasonality
from llmcap.sizing.measured import MeasuredModels
from llmcap.sizing.params import AutoscaleParams, SizeParams
from llmcap.sizing.planned import sized_blocks
from llmcap.sizing.units import Lengths, Unit, candidate_row, make_unit

ROLES = {
    "instances": ("both",),
    "prefill": ("prefill",),
    "decode": ("decode",),
}  # pool name in the summary -> candidate roles


def plan_whatif(
    trace: pa.Table,
    candidates: pd.DataFrame,
    model: ModelSpec,
    size: SizeParams,
    summary: Mapping[str, Any],
    params: AutoscaleParams,
    seed: int = 0,
    measured: MeasuredModels | None = None,
    on_plan: Callable[[str], None] | None = None,
) -> AutoscaleWhatIf:
    """The summary's chosen deployment over a day whose mean is its planning rate (`params`)."""
    pools = summary["pool_plans"]
    if set(pools) not in ({"instances"}, {"prefill", "decode"}):
        raise LlmcapError(
            f"the capacity summary's pools {sorted(pools)} are neither one aggregated pool nor a prefill and a decode pool"
        )
    lengths = Lengths.of(trace)
    blocks = dict(
        zip(("front", "decode"), sized_blocks(summary), strict=True)
    )  # the KV the plan was sized with (`size.kv_budget`)

    def row(name: str, key: str) -> Mapping[str, Any]:
        r = candidate_row(candidates, key, ROLES[name])
        n = blocks["decode" if name == "decode" else "front"]
        return r if n is None else {**r, "kv_tokens_per_instance": n * int(r["block_size"])}

    units = {
        name: make_unit(
            model, row(name, q["configuration"]), lengths, size.slo, measured, size.admission_policy, size.prefix_tiers
        )
        for name, q in pools.items()
    }
    rates = [
        PoolRate(ROLES[name][0], float(q["per_instance_rps"]), int(q["gpus_per_instance"])) for name, q in pools.items()
    ]
    main = units.get("instances") or units["prefill"]
    pd_cfg = None if "decode" not in units else _pd_config(units["prefill"], units["decode"], size)
    decode_model = None if "decode" not in units else units["decode"].step_model
    day, fitted, flat, note = forecast_day(trace, params, float(summary["planning_rps"]))
    return autoscale_whatif(
        trace,
        main.step_model,
        main.engine,
        size.slo,
        rates,
        day,
        _scaler(params),
        params.floor_fractions,
        params.forecast_error,
        params.utilization,
        params.windows,
        seed,
        str(summary.get("router") or size.router),
        pd_cfg,
        decode_model,
        on_plan,
        fitted,
        flat,
        note,
        params.max_total_gpus,
    )


def _pd_config(prefill: Unit, decode: Unit, size: SizeParams) -> PDConfig:
    """One prefill and one decode replica behind the prefill instance's NICs (the autoscaler sets the counts)."""
    link = LinkConfig(bandwidth_bytes_s=prefill.gpu.nic_bytes_s * prefill.gpus, latency_s=size.pd_link_latency_s)
    return PDConfig(
        prefill_replicas=1,
        decode_replicas=1,
        link=link,
        first_token_from=first_token_from(size.slo.ttft_includes_handoff),
        decode_engine=decode.engine,
    )


def _scaler(params: AutoscaleParams) -> AutoscaleConfig:
    """The autoscaler's loop and a new pod's readiness (running, model loaded, routable) from `params`."""
    running, ready, routable = params.ready_points_s
    return AutoscaleConfig(
        t_ready_s=routable,
        pod_running_after_s=running,
        model_ready_after_s=ready,
        interval_s=params.interval_s,
        min_residency_s=params.min_residency_s,
        scale_down_window_s=params.scale_down_window_s,
        metric_window_s=params.metric_window_s,
        waiting_per_replica=params.waiting_per_replica,
        kv_usage=None,
    )


def forecast_day(
    trace: pa.Table, params: AutoscaleParams, planning_rps: float
) -> tuple[Day, Forecast | None, Forecast | None, str]:
    """The day to serve and the floor's forecasts: the trace's held-back part with its fitted and flat forecasts where
    `params.forecast` is `fit` and the trace spans enough time; else the synthesized day at `planning_rps` (None, None)
    and why."""
    synthetic = DiurnalDay(planning_rps, params.amplitude, params.period_s, params.duration_s)
    if params.forecast == "synthetic":
        return (
            synthetic,
            None,
            None,
            f"forecast: the synthesized day's own curve × (1 + {params.forecast_error:g}) (autoscale.forecast: synthetic)",
        )
    arrival = trace.column("arrival_s").to_numpy()
    fit = fit_seasonality(
        arrival,
        params.forecast_bin_s,
        params.forecast_holdout,
        params.forecast_harmonics,
        params.forecast_error_quantile,
    )
    if fit.fitted is None or fit.flat is None:
        return synthetic, None, None, f"forecast NOT fitted: {fit.reason}"
    start = float(arrival.min()) + fit.holdout_start_s
    day = TraceDay(trace, start, params.forecast_bin_s)
    fitted = replace(fit.fitted, curve=fit.fitted.curve.shifted(fit.holdout_start_s))  # type: ignore[attr-defined]
    flat = replace(fit.flat, curve=fit.flat.curve.shifted(fit.holdout_start_s))  # type: ignore[attr-defined]
    rmse = fit.holdout_rmse or (math.nan, math.nan)
    note = (
        f"forecast fitted: {fit.reason}: error {fitted.error:.3g} (flat: {flat.error:.3g}); held-back RMSE {rmse[0]:.3g} req/s "
        f"(flat {rmse[1]:.3g}); the day served is that held-back part at its own rate, not the planning rate {planning_rps:.4g} req/s"
    )
    return day, fitted, flat, note
