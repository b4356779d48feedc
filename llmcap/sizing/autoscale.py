"""Autoscaling what-if: a synthesized diurnal day served by a static pool and by autoscaled pools.

The static plan holds N_static = ⌈peak rate ÷ G⌉ replicas all day (G: one replica's max feasible rate from
the sizing search). An autoscaled plan follows N_target(t) = max(N_floor(t), N_reactive(t))
(`llmcap.sim.autoscaler`), in the simulator, with T_ready and a cold prefix cache on every new replica:

- N_floor(t) = ⌈f · max λ(s) over s ∈ [t, t + T_ready + interval] · (1 + forecast_error) ÷ G⌉: what must be
  asked for now to be routable when the demand comes; the forecast here is the day's own rate curve, off by
  `forecast_error` at most. `f` (the floor fraction) runs from 0 (purely reactive) to 1 (the full floor).
- N_reactive(t): HPA's rule on the replicas' waiting requests and KV usage. The KV-usage target is what one
  replica shows at `utilization` × G (simulated on the same request mix), so it means "utilisation above
  the operating point", as an operator would set it.

Each plan's cost is its replica-seconds (start-up and drain included) × GPUs per replica; each is judged by
SLO attainment over the whole day and its worst window. The floor that keeps attainment is the smallest
fraction whose day-long attainment meets the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from llmcap.errors import LlmcapError
from llmcap.perf.model import StepTimeModel
from llmcap.sim import AutoscaleConfig, AutoscaleLog, EngineConfig, SimConfig, simulate
from llmcap.sizing.params import SloParams
from llmcap.sizing.simeval import excerpt
from llmcap.sizing.slo import Window, attainment
from llmcap.trace.params import ArrivalSpec
from llmcap.trace.synth import scale_rate, synthesize

FORECAST_GRID = 64  # samples of the rate curve per look-ahead window
KV_PROBE_REQUESTS = 2000  # requests of the run that sets the KV-usage target


@dataclass(frozen=True)
class DiurnalDay:
    """λ(t) = mean · (1 + amplitude · sin(2πt / period)) over [0, duration) (the synthesis' own curve)."""

    mean_rps: float
    amplitude: float
    period_s: float = 86_400.0
    duration_s: float = 86_400.0

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        return self.mean_rps * (1.0 + self.amplitude * np.sin(2.0 * np.pi * np.asarray(t) / self.period_s))

    @property
    def peak_rps(self) -> float:
        return float(self.rate_at(np.linspace(0.0, self.duration_s, 8193)).max())

    def requests(self, trace: pa.Table, rng: np.random.Generator) -> pa.Table:
        """The day: requests drawn whole from `trace` (lengths and prefixes together) on its arrival curve."""
        n = max(2, round(self.mean_rps * self.duration_s))
        spec = ArrivalSpec(rate_rps=self.mean_rps, diurnal_amplitude=self.amplitude, diurnal_period_s=self.period_s)
        return synthesize(trace, n, spec, rng)


@dataclass(frozen=True)
class PlanOutcome:
    """One plan over the day."""

    name: str
    floor_fraction: float | None  # None: the static plan
    replica_hours: float
    gpu_hours: float
    attainment: float  # over the whole day
    worst_window_attainment: float  # over the worst of `windows` equal windows of the day
    peak_replicas: int
    scale_ups: int  # replicas asked for after the start
    log: AutoscaleLog | None

    def keeps(self, target: float) -> bool:
        return self.attainment >= target


@dataclass(frozen=True)
class AutoscaleWhatIf:
    day: DiurnalDay
    instance_rps: float  # G
    gpus_per_replica: int
    static_replicas: int
    kv_usage_target: float | None
    static: PlanOutcome
    autoscaled: tuple[PlanOutcome, ...]
    attainment_target: float

    @property
    def floor(self) -> PlanOutcome | None:
        """The autoscaled plan with the smallest floor fraction that keeps the attainment target."""
        kept = [p for p in self.autoscaled if p.keeps(self.attainment_target)]
        return min(kept, key=lambda p: (p.floor_fraction, p.gpu_hours)) if kept else None

    @property
    def saving(self) -> float | None:
        """GPU-hours the floor plan saves against the static one, as a share of the static plan's."""
        best = self.floor
        return None if best is None else 1.0 - best.gpu_hours / self.static.gpu_hours


def forecast_floor(day: DiurnalDay, instance_rps: float, fraction: float, t_ready_s: float, interval_s: float,
                   forecast_error: float) -> tuple[tuple[float, ...], tuple[int, ...]]:  # fmt: skip
    """N_floor as steps (module docstring): (times it changes, replicas from then on)."""
    ticks = np.arange(0.0, day.duration_s + interval_s, interval_s)
    ahead = ticks[:, None] + np.linspace(0.0, t_ready_s + interval_s, FORECAST_GRID)[None, :]
    peak = day.rate_at(ahead).max(axis=1) * (1.0 + forecast_error)
    need = np.ceil(fraction * peak / instance_rps - 1e-9).astype(np.int64)
    change = np.flatnonzero(np.diff(need, prepend=-1))
    return tuple(float(t) for t in ticks[change]), tuple(int(n) for n in need[change])


def kv_usage_at(trace: pa.Table, model: StepTimeModel, engine: EngineConfig, rate: float, seed: int = 0) -> float:
    """Mean KV usage of one replica serving an excerpt of `trace`'s request mix at `rate`, over the middle 80%
    of the arrival span (no warm-up, no drain)."""
    part = scale_rate(excerpt(trace, min(trace.num_rows, KV_PROBE_REQUESTS), seed), rate)
    result = simulate(part, model, SimConfig(engine=engine), rng=np.random.default_rng(seed))
    t = result.timeseries.column("t_s").to_numpy()
    arrival = part.column("arrival_s").to_numpy()
    lo, hi = np.quantile(arrival, [0.1, 0.9])
    steady = (t >= lo) & (t < hi)
    return float(np.mean(result.timeseries.column("kv_usage").to_numpy()[steady]))


def _outcome(name: str, fraction: float | None, records: pa.Table, replica_s: float, peak: int, ups: int, gpus: int,
             slo: SloParams, windows: int, log: AutoscaleLog | None) -> PlanOutcome:  # fmt: skip
    arrival = records.column("arrival_s").to_numpy()
    t0, t1 = float(arrival[0]), float(arrival[-1])
    edges = np.linspace(t0, t1, windows + 1)
    worst = min(
        attainment(records, slo, Window(a, b, closed_end=i == windows - 1))
        for i, (a, b) in enumerate(zip(edges[:-1], edges[1:]))
        if ((arrival >= a) & (arrival <= b)).any()
    )
    return PlanOutcome(
        name, fraction, replica_s / 3600.0, replica_s * gpus / 3600.0, attainment(records, slo, Window(t0, t1, closed_end=True)),
        worst, peak, ups, log,
    )  # fmt: skip


def autoscale_whatif(
    trace: pa.Table,
    model: StepTimeModel,
    engine: EngineConfig,
    slo: SloParams,
    instance_rps: float,
    day: DiurnalDay,
    gpus_per_replica: int = 1,
    scaler: AutoscaleConfig | None = None,
    fractions: Sequence[float] = (0.0, 0.5, 0.75, 1.0),
    forecast_error: float = 0.1,
    utilization: float = 0.8,
    windows: int = 24,
    seed: int = 0,
    router: str = "least_outstanding_tokens",
    on_plan: Callable[[str], None] | None = None,
) -> AutoscaleWhatIf:
    """Serve one synthesized day statically and with each floor fraction (module docstring)."""
    if not instance_rps > 0:
        raise LlmcapError(f"one replica's max feasible rate must be positive to plan a pool, got {instance_rps:g} req/s")
    if not fractions or any(not 0.0 <= f <= 1.5 for f in fractions):
        raise LlmcapError(f"floor fractions must lie in [0, 1.5], got {list(fractions)}")
    base = scaler or AutoscaleConfig()
    static_n = max(1, math.ceil(day.peak_rps / instance_rps - 1e-9))
    if static_n > base.max_replicas:
        base = base.model_copy(update={"max_replicas": static_n * 2})
    kv_target = base.kv_usage
    if scaler is None or scaler.kv_usage is None:
        kv_target = min(1.0, max(1e-3, kv_usage_at(trace, model, engine, utilization * instance_rps, seed)))
    # the day starts where the previous one ended: with what its first minutes need, whatever the policy
    start_n = base.initial_replicas or math.ceil(float(day.rate_at(0.0)) * (1.0 + forecast_error) / instance_rps - 1e-9)
    base = base.model_copy(update={"kv_usage": kv_target, "initial_replicas": max(1, start_n)})
    requests = day.requests(trace, np.random.default_rng(seed))
    bins = max(1.0, day.duration_s / 2000.0)  # time series kept coarse: a day has many replicas

    def run(config: SimConfig) -> tuple[pa.Table, AutoscaleLog | None]:
        result = simulate(requests, model, config, rng=np.random.default_rng(seed))
        return result.records, result.autoscale

    if on_plan:
        on_plan(f"static ({static_n} replicas)")
    records, _ = run(SimConfig(engine=engine, replicas=static_n, router=router, timeseries_resolution_s=bins))  # type: ignore[arg-type]
    end = float(np.nanmax(records.column("finish_s").to_numpy(zero_copy_only=False).astype(np.float64)))
    static = _outcome("static", None, records, static_n * end, static_n, 0, gpus_per_replica, slo, windows, None)
    plans = []
    for f in fractions:
        if on_plan:
            on_plan(f"autoscaled, floor × {f:g}")
        times, counts = forecast_floor(day, instance_rps, f, base.t_ready_s, base.interval_s, forecast_error)
        cfg = base.model_copy(update={"floor_times_s": times, "floor_replicas": counts})
        records, log = run(SimConfig(engine=engine, router=router, autoscale=cfg, timeseries_resolution_s=bins))  # type: ignore[arg-type]
        assert log is not None
        asked = log.replicas.column("asked_s").to_numpy()
        peak = int(np.max(log.ticks.column("ready").to_numpy() + log.ticks.column("starting").to_numpy()))
        plans.append(_outcome(f"auto f={f:g}", f, records, log.replica_seconds, peak, int((asked > 0).sum()),
                              gpus_per_replica, slo, windows, log))  # fmt: skip
    return AutoscaleWhatIf(day, instance_rps, gpus_per_replica, static_n, kv_target, static, tuple(plans), slo.attainment_target)
