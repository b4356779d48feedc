"""The autoscaling what-if's forecast fitted from the trace (seasonality, error from a held-back part) against the flat
one, and T_ready as the sum of its phases moving every scale-up."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sim"))
from _workloads import MODEL, canonical, table  # noqa: E402

from llmcap.perf.model import LinearStepModel  # noqa: E402
from llmcap.sim import AutoscaleConfig, EngineConfig  # noqa: E402
from llmcap.sizing.autoscale_plan import forecast_day  # noqa: E402
from llmcap.sizing.autoscale_whatif import DiurnalDay, PoolRate, TraceDay, autoscale_whatif, scale_up_points  # noqa: E402
from llmcap.sizing.forecast import DAY_S, WEEK_S, fit_seasonality  # noqa: E402
from llmcap.sizing.params import AutoscaleParams, ReadyPhases, SearchParams, SloParams  # noqa: E402
from llmcap.sizing.search import search_max_rate  # noqa: E402
from llmcap.sizing.simeval import SimEvaluate  # noqa: E402
from llmcap.trace.params import ArrivalSpec  # noqa: E402
from llmcap.trace.synth import generate_arrivals  # noqa: E402

MEAN, AMPLITUDE = 0.1, 0.6  # req/s; the daily swing


def seasonal_trace(days: float, mean: float = MEAN, seed: int = 0):
    """Poisson arrivals on mean × (1 + A sin 2πt/day) — a daily pattern with counting noise — and short requests."""
    rng = np.random.default_rng(seed)
    arrival = generate_arrivals(
        int(mean * days * DAY_S), ArrivalSpec(rate_rps=mean, diurnal_amplitude=AMPLITUDE, diurnal_period_s=DAY_S), rng
    )
    n = arrival.size
    return canonical(table({"arrival_s": arrival, "isl": rng.integers(50, 300, n), "osl": rng.integers(10, 30, n)}))


def test_the_fit_recovers_the_daily_cycle_and_measures_its_error_on_the_held_back_part():
    arrival = seasonal_trace(5).column("arrival_s").to_numpy()
    fit = fit_seasonality(arrival)
    assert fit.fitted is not None and fit.flat is not None
    c = (
        fit.fitted.curve.coef
    )  # [1, cos 1, sin 1, cos 2, sin 2, ...]: λ = 0.1 + 0.06 sin(2πt/day) → c0 = 0.1, sin-1 = 0.1 × 0.6
    assert (
        c[0] == pytest.approx(MEAN, rel=0.05) and c[2] == pytest.approx(MEAN * AMPLITUDE, rel=0.1) and abs(c[1]) < 0.01
    )
    assert fit.holdout_start_s == pytest.approx(0.8 * 5 * DAY_S, abs=900)  # the last 20% of 5 days (bin edges of 900 s)
    # over the held-back day the flat forecast is off by about the swing (P95 of 1 + 0.6 sin − 1 ≈ 0.6), the fit by the noise
    # (a 900 s bin holds ~90 arrivals: ±10% at one sigma)
    assert 0.45 < fit.flat.error < 0.8 and 0.0 < fit.fitted.error < 0.3
    assert fit.holdout_rmse[0] < fit.holdout_rmse[1] / 2
    assert "daily seasonality" in fit.reason and "weekly" not in fit.reason


def test_weekly_seasonality_only_from_two_weeks_on():
    fit = fit_seasonality(seasonal_trace(15, mean=0.005).column("arrival_s").to_numpy(), bin_s=3600)
    assert fit.fitted is not None and fit.fitted.curve.periods_s == (DAY_S, WEEK_S) and "daily and weekly" in fit.reason
    assert fit_seasonality(
        seasonal_trace(10, mean=0.005).column("arrival_s").to_numpy(), bin_s=3600
    ).fitted.curve.periods_s == (DAY_S,)


def test_a_short_trace_says_it_cannot_fit_and_keeps_the_synthesized_day():
    trace = seasonal_trace(1 / 24, mean=1.0)  # one hour
    fit = fit_seasonality(trace.column("arrival_s").to_numpy())
    assert fit.fitted is None and fit.flat is None
    a = trace.column("arrival_s").to_numpy()
    spans = f"spans {(a.max() - a.min()) / 3600:.3g} h"  # ~1 h of Poisson arrivals
    assert (
        spans in fit.reason and "at least 2 days" in fit.reason and "keeps the synthesized diurnal curve" in fit.reason
    )
    day, fitted, flat, note = forecast_day(trace, AutoscaleParams(), planning_rps=5.0)
    assert isinstance(day, DiurnalDay) and day.mean_rps == 5.0 and fitted is None and flat is None
    assert note.startswith(f"forecast NOT fitted: the trace {spans}")
    day, _, _, note = forecast_day(seasonal_trace(5), AutoscaleParams(forecast="synthetic"), planning_rps=5.0)
    assert (
        isinstance(day, DiurnalDay) and "autoscale.forecast: synthetic" in note
    )  # asked not to fit, even with days of trace


# slow instances (a 2 s step, 2 sequences): one serves ~0.02 req/s, so the day's 0.1 req/s needs several
SLOW = LinearStepModel(
    overhead_s=2.0,
    per_prefill_token_s=1e-3,
    per_pair_s=0.0,
    per_prefill_seq_s=0.0,
    per_decode_seq_s=0.05,
    per_context_token_s=0.0,
)
SLOW_ENGINE = EngineConfig(num_blocks=48, max_num_seqs=2, max_num_batched_tokens=512)
SLOW_SLO = SloParams(ttft_ms=60_000, itl_ms=6000, attainment_target=0.99)


def test_a_fitted_seasonal_floor_beats_the_flat_one_on_the_held_back_day():
    trace = seasonal_trace(5)
    g = search_max_rate(
        SimEvaluate(trace, SLOW, SLOW_ENGINE, SLOW_SLO, excerpt_requests=1000),
        SLOW_SLO.attainment_target,
        SearchParams(seeds=(0,), rel_tol=0.05),
    ).max_rate
    assert 0 < g < MEAN / 3  # the peak needs more than 5 instances
    params = AutoscaleParams(t_ready_s=600.0)
    day, fitted, flat, note = forecast_day(trace, params, planning_rps=MEAN)
    assert isinstance(day, TraceDay) and fitted is not None and flat is not None and note.startswith("forecast fitted")
    assert day.duration_s == pytest.approx(DAY_S, abs=1000)  # the held-back fifth of 5 days, as it came
    # the reactive layer only as a safety valve (KV 90%): the floors decide, the comparison is of forecasts
    scaler = AutoscaleConfig(
        t_ready_s=600.0, interval_s=15.0, min_residency_s=600.0, scale_down_window_s=300.0, kv_usage=0.9
    )
    w = autoscale_whatif(
        trace,
        SLOW,
        SLOW_ENGINE,
        SLOW_SLO,
        [PoolRate("both", g, 1)],
        day,
        scaler,
        (1.0,),
        forecast=fitted,
        flat=flat,
        forecast_note=note,
    )
    seasonal, level = w.autoscaled[0], w.flat
    assert level is not None and seasonal.forecast == "fitted" and level.forecast == "flat"
    assert seasonal.keeps(SLOW_SLO.attainment_target) and level.keeps(SLOW_SLO.attainment_target)
    assert seasonal.attainment >= level.attainment
    assert seasonal.gpu_hours < 0.85 * level.gpu_hours  # the acceptance: the fitted floor follows the day down
    assert level.gpu_hours < 1.05 * w.static.gpu_hours  # the flat floor is about the peak all day: static's cost


def test_ready_phases_sum_to_t_ready_and_move_every_scale_up():
    # rate 3 (1 + 0.5 sin 2πt/600), G = 1: start ⌈3⌉ = 3; the floor asks the 4th at t = 0 and the 5th once its look-ahead
    # [t, t + T_ready + 10] reaches rate 4, at s* = 600 asin(2/3) / 2π = 69.7 s: T_ready 30 → first tick t ≥ 29.7: 30;
    # T_ready 90 → already at t = 0
    day = DiurnalDay(3.0, 0.5, 600.0, 600.0)
    trace = seasonal_trace(1 / 24, mean=5.0)
    expected = {30.0: [0.0, 30.0], 90.0: [0.0, 0.0]}
    for phases in (
        ReadyPhases(schedule_s=5, image_pull_s=5, weight_load_s=5, engine_init_s=5, compile_s=5, admission_s=5),
        ReadyPhases(schedule_s=15, image_pull_s=15, weight_load_s=15, engine_init_s=15, compile_s=15, admission_s=15),
    ):
        params = AutoscaleParams(ready=phases)
        running, ready, admitted = params.ready_points_s
        assert (running, ready, admitted) == (phases.schedule_s * 2, phases.schedule_s * 5, phases.schedule_s * 6)
        scaler = AutoscaleConfig(
            t_ready_s=admitted,
            pod_running_after_s=running,
            model_ready_after_s=ready,
            interval_s=10.0,
            min_residency_s=600.0,
            kv_usage=0.99,
            waiting_per_replica=1e6,
        )
        w = autoscale_whatif(
            trace,
            MODEL,
            SLOW_ENGINE.model_copy(update={"num_blocks": 4000, "max_num_seqs": 64}),
            SloParams(),
            [PoolRate("both", 1.0)],
            day,
            scaler,
            (1.0,),
            forecast_error=0.0,
        )
        ups = scale_up_points(w.autoscaled[0].log)
        assert [u["target_s"] for u in ups] == expected[admitted]
        for u in ups:  # each point at its phases' sum after the target was set
            assert (
                u["running_s"] - u["target_s"],
                u["model_ready_s"] - u["target_s"],
                u["admitted_s"] - u["target_s"],
            ) == (running, ready, admitted)
        assert w.ready_s == (running, ready, admitted)


def test_a_gpu_budget_caps_the_autoscaled_plan_not_the_static_one():
    # the day of the test above needs ⌈4.5 / 1⌉ = 5 instances of 2 GPUs at its peak; a budget of 8 GPUs holds 4
    day = DiurnalDay(3.0, 0.5, 600.0, 600.0)
    scaler = AutoscaleConfig(
        t_ready_s=30.0, interval_s=10.0, min_residency_s=600.0, kv_usage=0.99, waiting_per_replica=1e6
    )
    engine = SLOW_ENGINE.model_copy(update={"num_blocks": 4000, "max_num_seqs": 64})
    pools = [PoolRate("both", 1.0, gpus_per_instance=2)]
    free = autoscale_whatif(
        seasonal_trace(1 / 24, mean=5.0), MODEL, engine, SloParams(), pools, day, scaler, (1.0,), forecast_error=0.0
    )
    capped = autoscale_whatif(
        seasonal_trace(1 / 24, mean=5.0),
        MODEL,
        engine,
        SloParams(),
        pools,
        day,
        scaler,
        (1.0,),
        forecast_error=0.0,
        max_total_gpus=8,
    )
    assert free.autoscaled[0].peak_replicas == 5 and capped.autoscaled[0].peak_replicas == 4
    assert capped.static_counts == {"both": 5} and capped.max_total_gpus == 8
    assert capped.autoscaled[0].gpu_hours < free.autoscaled[0].gpu_hours
    from llmcap.report.autoscale_whatif import markdown

    assert "share a budget of 8 GPUs" in markdown(capped) and "the static plan needs 10, above it" in markdown(
        capped
    )  # 5 × 2 GPUs
