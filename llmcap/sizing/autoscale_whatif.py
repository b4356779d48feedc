"""Autoscaling what-if: a synthesized diurnal day served by a static deployment and by autoscaled ones.

A deployment is one aggregated pool or a P/D pair of pools, each with G: one instance's max feasible rate
from the sizing search. The static plan holds N_static = ⌈peak rate ÷ G⌉ instances of each pool all day.
An autoscaled plan scales each pool on its own by N_target(t) = max(N_floor(t), N_reactive(t))
(`llmcap.sim.autoscaler`), in the simulator, with T_ready and a cold prefix cache on every new instance:

- N_floor(t) = ⌈f · max λ̂(s) over s ∈ [t, t + T_ready + interval] · (1 + e) ÷ G⌉: what must be asked for now to
  be routable when the demand comes. The forecast λ̂ with its error e (`llmcap.sizing.forecast`): by default the
  synthesized day's own curve, off by `forecast_error` at most; where the trace spans days, the seasonality
  fitted on it, with e from its held-back part, and the day served is that held-back part as it came (`TraceDay`),
  beside the flat forecast's floor. `f` (the floor fraction) runs from 0 (purely reactive) to 1 (the full floor).
- N_reactive(t): HPA's rule on the pool's waiting requests and a utilisation gauge: KV usage (aggregated,
  decode) or requests running (prefill: its KV is freed at the handoff). The gauge's target is what one
  instance shows at `utilization` × G (simulated on the same request mix): "utilisation above the operating
  point", as an operator would set it.

T_ready is the sum of the start-up phases (`llmcap.sizing.params.ReadyPhases`); each scale-up's four points (target set,
pod running, model ready, router admitted) are in the log (`scale_up_points`). With `max_total_gpus` the pools share
one GPU budget (`llmcap.sim.autoscaler.share_budget` states who gets GPUs when both want them).

Each plan's cost is its instance-seconds (start-up and drain included) × GPUs per instance, over its pools;
each is judged by SLO attainment over the whole day and its worst window. The floor that keeps attainment
is the smallest fraction whose day-long attainment meets the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from llmcap.errors import LlmcapError
from llmcap.perf.model import StepTimeModel
from llmcap.sim import AutoscaleConfig, AutoscaleLog, EngineConfig, PDConfig, SimConfig, simulate
from llmcap.sim.autoscaler import share_budget
from llmcap.sizing.autoscale_days import Day, DiurnalDay, TraceDay  # noqa: F401 (the what-if's days, named here too)
from llmcap.sizing.forecast import Forecast
from llmcap.sizing.params import SloParams
from llmcap.sizing.simeval import excerpt
from llmcap.sizing.slo import Window, attainment
from llmcap.trace.synth import scale_rate

FORECAST_GRID = 64  # samples of the rate curve per look-ahead window
# each pool's utilisation signal (AutoscaleConfig field, time-series column): a prefill instance frees its KV at the
# handoff, so its KV usage says little about its load; the prompts it is working on do
SIGNAL = {
    "both": ("kv_usage", "kv_usage"),
    "decode": ("kv_usage", "kv_usage"),
    "prefill": ("running_per_replica", "running"),
}
KV_PROBE_REQUESTS = 2000  # requests of the run that sets the KV-usage target


@dataclass(frozen=True)
class PoolRate:
    """One pool of the deployment: its role ("both": aggregated, "prefill", "decode"), one instance's max
    feasible rate G, and its GPUs."""

    role: str
    instance_rps: float
    gpus_per_instance: int = 1


@dataclass(frozen=True)
class PlanOutcome:
    """One plan over the day."""

    name: str
    floor_fraction: float | None  # None: the static plan
    replica_hours: float  # instance-hours, every pool
    gpu_hours: float
    attainment: float  # over the whole day
    worst_window_attainment: float  # over the worst of `windows` equal windows of the day
    peak_replicas: int  # most instances at once (asked for or serving), every pool
    scale_ups: int  # instances asked for after the start
    log: AutoscaleLog | None
    forecast: str = "synthetic"  # the floor's forecast kind (Forecast.kind); "" for the static plan

    def keeps(self, target: float) -> bool:
        return self.attainment >= target


@dataclass(frozen=True)
class AutoscaleWhatIf:
    day: Day
    pools: tuple[PoolRate, ...]
    static_counts: dict[str, int]  # per pool role
    reactive_targets: dict[str, dict[str, float]]  # per pool role: {AutoscaleConfig field: target}
    static: PlanOutcome
    autoscaled: tuple[PlanOutcome, ...]
    attainment_target: float
    forecast: Forecast | None = None
    flat: PlanOutcome | None = None  # the flat forecast's floor at the largest fraction, beside a fitted one
    forecast_note: str = ""  # what was fitted from the trace, or why nothing was
    max_total_gpus: int | None = None
    ready_s: tuple[float, float, float] | None = None  # (pod running, model ready, router admitted) after the ask

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


def scale_up_points(log: AutoscaleLog) -> list[dict[str, float | str]]:
    """Every scale-up that reached the router, in order: its pool and four points (s): target replica set (asked), pod
    running, model ready, router admitted (NaN where the run did not know a phase)."""
    life = log.replicas.to_pandas()
    up = life[((life.asked_s > 0) | (life.ready_s > 0)) & life.ready_s.notna()].sort_values(
        ["asked_s", "pool", "replica"]
    )  # not those there at 0
    return [
        {
            "pool": str(r.pool),
            "target_s": float(r.asked_s),
            "running_s": float(r.running_s),
            "model_ready_s": float(r.model_ready_s),
            "admitted_s": float(r.ready_s),
        }
        for r in up.itertuples()
    ]


def forecast_floor(
    day: Day,
    instance_rps: float,
    fraction: float,
    t_ready_s: float,
    interval_s: float,
    forecast_error: float,
    forecast: Forecast | None = None,
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """N_floor as steps (module docstring): (times it changes, instances from then on). `forecast`: the curve and
    error planned for (None: the day's own curve, off by `forecast_error`)."""
    curve, error = (day.rate_at, forecast_error) if forecast is None else (forecast.rate_at, forecast.error)
    ticks = np.arange(0.0, day.duration_s + interval_s, interval_s)
    ahead = ticks[:, None] + np.linspace(0.0, t_ready_s + interval_s, FORECAST_GRID)[None, :]
    peak = curve(ahead).max(axis=1) * (1.0 + error)
    need = np.ceil(fraction * peak / instance_rps - 1e-9).astype(np.int64)
    change = np.flatnonzero(np.diff(need, prepend=-1))
    return tuple(float(t) for t in ticks[change]), tuple(int(n) for n in need[change])


def _config(
    engine: EngineConfig,
    router: str,
    counts: Mapping[str, int],
    pd: PDConfig | None,
    resolution: float,
    scalers: Mapping[str, AutoscaleConfig] | None = None,
    max_total_gpus: int | None = None,
) -> SimConfig:
    """The deployment at `counts` instances per pool role, or autoscaled by `scalers` (per role) under `max_total_gpus`."""
    scalers = scalers or {}
    budget = max_total_gpus if scalers else None
    if pd is None:
        return SimConfig(
            engine=engine,
            replicas=counts["both"],
            router=router,
            autoscale=scalers.get("both"),
            timeseries_resolution_s=resolution,
            max_total_gpus=budget,
        )
    pools = pd.model_copy(update={"prefill_replicas": counts["prefill"], "decode_replicas": counts["decode"]})
    return SimConfig(
        engine=engine,
        pd=pools,
        router=router,
        autoscale=scalers.get("prefill"),
        decode_autoscale=scalers.get("decode"),
        timeseries_resolution_s=resolution,
        max_total_gpus=budget,
    )


def reactive_targets(
    trace: pa.Table,
    model: StepTimeModel,
    engine: EngineConfig,
    pools: Sequence[PoolRate],
    utilization: float,
    pd: PDConfig | None = None,
    decode_model: StepTimeModel | None = None,
    router: str = "least_outstanding_tokens",
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Each pool's reactive target, {AutoscaleConfig field: value}: the mean of its utilisation gauge (`SIGNAL`) on one
    of its instances serving an excerpt of `trace` at `utilization` × its G (the other pool, P/D, given enough
    instances not to be the bottleneck), over the middle 80% of the arrival span (no warm-up, no drain)."""
    part = excerpt(trace, min(trace.num_rows, KV_PROBE_REQUESTS), seed)
    out = {}
    for q in pools:
        rate = utilization * q.instance_rps
        counts = {o.role: 1 if o is q else math.ceil(rate / o.instance_rps) + 1 for o in pools}
        probe = scale_rate(part, rate)
        result = simulate(
            probe,
            model,
            _config(engine, router, counts, pd, 1.0),
            rng=np.random.default_rng(seed),
            decode_model=decode_model,
        )
        ts = result.timeseries
        field, column = SIGNAL[q.role]
        t, role, gauge = (
            ts.column("t_s").to_numpy(),
            ts.column("role").to_numpy(zero_copy_only=False),
            ts.column(column).to_numpy(),
        )
        lo, hi = np.quantile(probe.column("arrival_s").to_numpy(), [0.1, 0.9])
        value = float(np.mean(gauge[(t >= lo) & (t < hi) & (role == q.role)]))
        out[q.role] = {field: min(1.0, max(1e-3, value)) if field == "kv_usage" else max(1e-3, value)}
    return out


def _outcome(
    name: str,
    fraction: float | None,
    records: pa.Table,
    replica_s: float,
    gpu_s: float,
    peak: int,
    ups: int,
    slo: SloParams,
    windows: int,
    log: AutoscaleLog | None,
    kind: str = "",
) -> PlanOutcome:
    arrival = records.column("arrival_s").to_numpy()
    t0, t1 = float(arrival[0]), float(arrival[-1])
    edges = np.linspace(t0, t1, windows + 1)
    worst = min(
        attainment(records, slo, Window(a, b, closed_end=i == windows - 1))
        for i, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True))
        if ((arrival >= a) & (arrival <= b)).any()
    )
    whole = attainment(records, slo, Window(t0, t1, closed_end=True))
    return PlanOutcome(name, fraction, replica_s / 3600.0, gpu_s / 3600.0, whole, worst, peak, ups, log, kind)


def autoscale_whatif(
    trace: pa.Table,
    model: StepTimeModel,
    engine: EngineConfig,
    slo: SloParams,
    pools: Sequence[PoolRate],
    day: Day,
    scaler: AutoscaleConfig | None = None,
    fractions: Sequence[float] = (0.0, 0.5, 0.75, 1.0),
    forecast_error: float = 0.1,
    utilization: float = 0.8,
    windows: int = 24,
    seed: int = 0,
    router: str = "least_outstanding_tokens",
    pd: PDConfig | None = None,
    decode_model: StepTimeModel | None = None,
    on_plan: Callable[[str], None] | None = None,
    forecast: Forecast | None = None,
    flat: Forecast | None = None,
    forecast_note: str = "",
    max_total_gpus: int | None = None,
) -> AutoscaleWhatIf:
    """Serve one day (synthesized, or the trace's held-back part) statically and with each floor fraction (module
    docstring). `pools`: one PoolRate "both" (aggregated), or "prefill" and "decode" with `pd` (its link and decode
    engine; its counts are set here) and `decode_model` (the decode pool's step times, when they differ). `scaler`: the
    autoscaler's knobs (its floor, initial count, GPUs per instance and, unless given, KV target are set here per pool).
    `forecast`: what the floor plans for (None: the day's curve × (1 + forecast_error)); `flat`: a second forecast whose
    floor at the largest fraction is simulated beside it; `max_total_gpus`: one GPU budget for the autoscaled pools."""
    _check_inputs(pools, pd, fractions)
    base = scaler or AutoscaleConfig()
    static = {q.role: max(1, math.ceil(day.peak_rps / q.instance_rps - 1e-9)) for q in pools}
    base = base.model_copy(update={"max_replicas": max(base.max_replicas, 2 * max(static.values()))})
    targets = _given_targets(scaler, pools)
    if targets is None:
        probed = reactive_targets(trace, model, engine, pools, utilization, pd, decode_model, router, seed)
        targets = {role: {"kv_usage": None, "running_per_replica": None} | t for role, t in probed.items()}
    main = forecast or Forecast("synthetic", day, forecast_error, f"the day's own curve × (1 + {forecast_error:g})")
    runs = _DayRuns(
        day,
        tuple(pools),
        day.requests(trace, np.random.default_rng(seed)),
        model,
        decode_model,
        engine,
        router,
        pd,
        seed,
        max(1.0, day.duration_s / 2000.0),  # time series kept coarse: a day has many instances
        slo,
        windows,
        max_total_gpus,
        on_plan,
    )
    static_plan = runs.static(static)
    plans = [runs.autoscaled(base, targets, f, main, f"auto f={f:g}") for f in fractions]
    flat_plan = None
    if flat is not None and max(fractions) > 0:
        flat_plan = runs.autoscaled(base, targets, max(fractions), flat, f"auto flat f={max(fractions):g}")
    set_targets = {role: {k: v for k, v in t.items() if v is not None} for role, t in targets.items()}
    nan = lambda x: math.nan if x is None else x  # noqa: E731
    ready = (nan(base.pod_running_after_s), nan(base.model_ready_after_s), base.t_ready_s)
    return AutoscaleWhatIf(
        day,
        tuple(pools),
        static,
        set_targets,
        static_plan,
        tuple(plans),
        slo.attainment_target,
        main,
        flat_plan,
        forecast_note,
        max_total_gpus,
        ready,
    )


def _check_inputs(pools: Sequence[PoolRate], pd: PDConfig | None, fractions: Sequence[float]) -> None:
    roles = sorted(q.role for q in pools)
    if roles not in (["both"], ["decode", "prefill"]) or (pd is None) != (roles == ["both"]):
        raise LlmcapError(
            f"pools must be one aggregated pool, or a prefill and a decode pool with pd; got {roles} (pd {'set' if pd else 'unset'})"
        )
    for q in pools:
        if not q.instance_rps > 0:
            raise LlmcapError(
                f"one {q.role} instance's max feasible rate must be positive to plan a pool, got {q.instance_rps:g} req/s"
            )
    if not fractions or any(not 0.0 <= f <= 1.5 for f in fractions):
        raise LlmcapError(f"floor fractions must lie in [0, 1.5], got {list(fractions)}")


def _given_targets(
    scaler: AutoscaleConfig | None, pools: Sequence[PoolRate]
) -> dict[str, dict[str, float | None]] | None:
    """The reactive targets set on `scaler`, the same for every pool; None when it sets none (they are probed)."""
    if scaler is None or (scaler.kv_usage is None and scaler.running_per_replica is None):
        return None
    return {q.role: {"kv_usage": scaler.kv_usage, "running_per_replica": scaler.running_per_replica} for q in pools}


@dataclass(frozen=True)
class _DayRuns:
    """One day's requests served by the deployment, each plan from the same seed: the static plan, then each
    autoscaled one (`on_plan` names each before it runs)."""

    day: Day
    pools: tuple[PoolRate, ...]
    requests: pa.Table
    model: StepTimeModel
    decode_model: StepTimeModel | None
    engine: EngineConfig
    router: str
    pd: PDConfig | None
    seed: int
    resolution: float
    slo: SloParams
    windows: int
    max_total_gpus: int | None
    on_plan: Callable[[str], None] | None

    @property
    def gpus(self) -> dict[str, int]:
        return {q.role: q.gpus_per_instance for q in self.pools}

    def run(self, config: SimConfig) -> tuple[pa.Table, AutoscaleLog | None]:
        rng = np.random.default_rng(self.seed)
        result = simulate(self.requests, self.model, config, rng=rng, decode_model=self.decode_model)
        return result.records, result.autoscale

    def static(self, counts: dict[str, int]) -> PlanOutcome:
        """`counts` instances per pool all day, held from the start to the last request's finish."""
        if self.on_plan:
            self.on_plan("static (" + " + ".join(f"{role} {n}" for role, n in counts.items()) + ")")
        records, _ = self.run(_config(self.engine, self.router, counts, self.pd, self.resolution))
        end = float(np.nanmax(records.column("finish_s").to_numpy(zero_copy_only=False).astype(np.float64)))
        gpus = self.gpus
        replica_s, gpu_s = sum(counts.values()) * end, sum(n * gpus[r] * end for r, n in counts.items())
        return _outcome(
            "static", None, records, replica_s, gpu_s, sum(counts.values()), 0, self.slo, self.windows, None
        )

    def start(self, fc: Forecast) -> dict[str, int]:
        """Each pool's instances at t = 0: the day starts where the previous one ended, with what its first minutes
        need (forecast `fc`), whatever the policy; within `max_total_gpus` by the budget's rule from nothing held."""
        gpus, budget = self.gpus, self.max_total_gpus
        n = {
            q.role: max(1, math.ceil(float(fc.rate_at(0.0)) * (1.0 + fc.error) / q.instance_rps - 1e-9))
            for q in self.pools
        }
        if budget is None or sum(n[r] * gpus[r] for r in n) <= budget:
            return n
        order = sorted(n, key=lambda r: r != "prefill")  # prefill (or aggregated) first, decode last: share_budget's
        granted = share_budget([0] * len(order), [n[r] for r in order], [gpus[r] for r in order], budget)
        if min(granted) < 1:
            raise LlmcapError(f"max_total_gpus {budget} does not hold one instance of every pool ({gpus} GPUs each)")
        return dict(zip(order, granted, strict=True))

    def autoscaled(
        self,
        base: AutoscaleConfig,
        targets: Mapping[str, dict[str, float | None]],
        f: float,
        fc: Forecast,
        name: str,
    ) -> PlanOutcome:
        """Each pool autoscaled by `base` with its reactive `targets` and floor × `f` of forecast `fc`."""
        if self.on_plan:
            self.on_plan(f"{name} (floor × {f:g} of the {fc.kind} forecast)")
        gpus, scalers, first = self.gpus, {}, self.start(fc)
        for q in self.pools:
            times, counts = forecast_floor(self.day, q.instance_rps, f, base.t_ready_s, base.interval_s, fc.error, fc)
            scalers[q.role] = base.model_copy(
                update={
                    "floor_times_s": times,
                    "floor_replicas": counts,
                    "initial_replicas": first[q.role],
                    "gpus_per_replica": gpus[q.role],
                }
                | targets[q.role]
            )
        config = _config(self.engine, self.router, first, self.pd, self.resolution, scalers, self.max_total_gpus)
        records, log = self.run(config)
        assert log is not None
        life, ticks = log.replicas.to_pandas(), log.ticks.to_pandas()
        held = sum(log.replica_seconds(role) * gpus[role] for role in gpus)
        peak = int((ticks.ready + ticks.starting).groupby(ticks.t_s).sum().max())
        ups = int((life.asked_s > 0).sum())
        return _outcome(name, f, records, log.replica_seconds(), held, peak, ups, self.slo, self.windows, log, fc.kind)
