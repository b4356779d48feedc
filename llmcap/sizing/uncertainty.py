"""Uncertainty on the GPU count: how much of the answer is the draw of arrivals, not the workload.

Two figures, both from seeds (each seed replays a different excerpt in the search, and spreads tied
timestamps and drives the power-of-two router differently in the whole-trace scenarios):
- Rate spread per pool: each seed's own max feasible rate, read off the search's evaluations (every rate
  is evaluated for every seed): the highest rate that seed passed below the lowest it failed. The base
  count λ·m/G per pool then spans [λ·m/G_max, λ·m/G_min]; when that interval straddles an integer, the
  base count is within seed noise of the next integer and the report says so.
- Count range: the final plan's scenarios, and each pool with one instance fewer, are simulated again on
  each extra seed. A seed on which the plan fails a scenario needs (at least) one more instance of the pool
  the failure points at; a seed on which one fewer still passes every scenario needs (at most) one fewer.
  The range is the point answer with those steps, in GPUs: a ±1-instance resolution per pool, stated.
- Model error: the plan is fitted again (`llmcap.sizing.scenarios.fit`) with every pool's step times × (1 − e)
  and × (1 + e), e the pool's step-time model's own known error (`llmcap.perf.model_error`): the count if the
  model is that much optimistic or pessimistic. The reported range spans both sources.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from llmcap.sizing.analytic import ceil_count
from llmcap.sizing.headroom import CapacityPlan
from llmcap.sizing.scenarios import Counts, Judge, Parallel, ScenarioResult, check
from llmcap.sizing.search import EvalResult, SearchResult

RunSeed = Callable[[Counts, int], EvalResult]
"""(serving instances per pool, seed) → the whole-trace evaluation of that deployment at the planning rate."""


def seed_max_rates(result: SearchResult) -> dict[int, float]:
    """Each seed's own max feasible rate from a search's evaluations (confirmation included): the highest
    rate it passed below the lowest rate it failed (0 when it passed none)."""
    points = [*result.points, *(() if result.confirmation is None else result.confirmation.points)]
    out = {}
    for i, seed in enumerate(result.points[0].seeds if result.points else ()):
        runs = [(p.rate, p.results[i]) for p in points]
        ok = [(rate, r.attainment >= result.attainment_target and r.run_ok) for rate, r in runs]
        failed = min((rate for rate, passed in ok if not passed), default=math.inf)
        out[seed] = max((rate for rate, passed in ok if passed and rate < failed), default=0.0)
    return out


@dataclass(frozen=True)
class PoolSpread:
    pool: str
    rates: dict[int, float]  # seed → the pool's per-instance max rate G
    base: tuple[float, float]  # λ·m/G at the fastest and the slowest seed: the unrounded base count
    near_integer: bool  # the base interval straddles an integer: the rounded base count is seed noise

    def describe(self) -> str:
        lo, hi = min(self.rates.values()), max(self.rates.values())
        spread = 0.0 if hi <= 0 else (hi - lo) / hi
        verdict = (
            f"within seed noise of {ceil_count(self.base[0])} vs {ceil_count(self.base[1])} instances"
            if self.near_integer
            else f"{ceil_count(self.base[1])} instances at every seed"
        )
        per_seed = ", ".join(f"seed {s}: {r:.4g}" for s, r in sorted(self.rates.items()))
        return (
            f"{self.pool}: G {lo:.4g}–{hi:.4g} req/s per instance (spread {spread:.0%}; {per_seed}); "
            f"base {self.base[0]:.2f}–{self.base[1]:.2f} instances: {verdict}"
        )


def pool_spread(pool: str, rates: Mapping[int, float], rate_rps: float, memory_factor: float = 1.0) -> PoolSpread:
    """`pool`'s seed spread of G and what it does to the unrounded base count λ·m/G."""
    lo, hi = min(rates.values()), max(rates.values())
    need = rate_rps * memory_factor
    base = (need / hi if hi > 0 else math.inf, need / lo if lo > 0 else math.inf)
    return PoolSpread(pool, dict(rates), base, ceil_count(base[0]) != ceil_count(base[1]))


@dataclass(frozen=True)
class SeedCheck:
    seed: int
    failed: ScenarioResult | None  # the plan's first failing scenario on this seed; None = all pass
    fewer_passes: tuple[str, ...]  # pools that pass every scenario with one instance fewer on this seed


@dataclass(frozen=True)
class ModelErrorEnd:
    """The plan fitted again with step times scaled: what the count is if the step-time model is off by its known error."""

    end: str  # "faster" (step times × (1 − e)) | "slower" (× (1 + e))
    factors: dict[str, float]  # pool -> the factor its step times were scaled by
    bases: dict[str, str]  # pool -> where its e comes from
    gpus: int | None  # the fitted count; None when no count within the cost limit passed
    counts: dict[str, int]

    def line(self) -> str:
        groups: dict[tuple[float, str], list[str]] = {}
        for pool, f in self.factors.items():
            groups.setdefault((f, self.bases[pool]), []).append(pool)
        scaled = ", ".join(f"{' and '.join(pools)} ×{f:.3g} ({basis})" for (f, basis), pools in groups.items())
        got = (
            f"{self.gpus} GPUs ({', '.join(f'{k} {v}' for k, v in self.counts.items())})"
            if self.gpus is not None
            else "no count within the cost limit passes"
        )
        return f"step times {self.end} by the model's own error — {scaled}: {got}"


@dataclass(frozen=True)
class CountRange:
    point_gpus: int
    low_gpus: int
    high_gpus: int
    seeds: tuple[int, ...]  # every seed judged, the point answer's first
    checks: tuple[SeedCheck, ...]  # the extra seeds'
    spreads: tuple[PoolSpread, ...]
    model_error: tuple[ModelErrorEnd, ...] = ()
    model_error_note: str = ""  # why the model-error ends are missing, when they are

    @property
    def low(self) -> int:
        """The range's low end over seeds and the model's error."""
        return min([self.low_gpus, *(e.gpus for e in self.model_error if e.gpus is not None)])

    @property
    def high(self) -> int | None:
        """The range's high end over seeds and the model's error (None: the slower end has no passing count)."""
        if any(e.gpus is None for e in self.model_error):
            return None
        return max([self.high_gpus, *(e.gpus for e in self.model_error if e.gpus is not None)])

    def headline(self) -> str:
        high = "no passing count" if self.high is None else str(self.high)
        what = "seeds and the step-time model's error" if self.model_error else "seeds"
        return f"{self.point_gpus} GPUs ({self.low}–{high} over {what})"

    def lines(self) -> list[str]:
        out = [f"{self.headline()}: low end assumes the fastest of them, high end the slowest"]
        out.append(
            f"GPU count {self.low_gpus}–{self.high_gpus} across seeds {', '.join(map(str, self.seeds))} (point answer "
            f"{self.point_gpus}; ±1 instance per pool resolution: each seed's scenarios at the plan and one fewer per pool)"
        )
        out += [e.line() for e in self.model_error] + ([self.model_error_note] if self.model_error_note else [])
        for c in self.checks:
            plan = "passes every scenario" if c.failed is None else f"FAILS {c.failed.describe()} → +1 {c.failed.blame}"
            fewer = (
                f"; one fewer still passes in {', '.join(c.fewer_passes)}"
                if c.fewer_passes
                else "; one fewer fails in every pool"
            )
            out.append(f"seed {c.seed}: the plan {plan}{fewer}")
        out += [s.describe() for s in self.spreads]
        return out

    def as_dict(self) -> dict:
        return {
            "point_gpus": self.point_gpus,
            "low_gpus": self.low_gpus,
            "high_gpus": self.high_gpus,
            "seeds": list(self.seeds),
            "low": self.low,
            "high": self.high,
            "headline": self.headline(),
            "model_error": [
                {"end": e.end, "factors": e.factors, "bases": e.bases, "gpus": e.gpus, "counts": e.counts}
                for e in self.model_error
            ],
            "near_integer": {s.pool: s.near_integer for s in self.spreads},
            "rate_by_seed": {s.pool: {str(k): v for k, v in s.rates.items()} for s in self.spreads},
            "lines": self.lines(),
        }


def count_range(
    plan: CapacityPlan,
    run: RunSeed,
    judge: Judge,
    point_seed: int,
    extra_seeds: Sequence[int],
    spreads: Sequence[PoolSpread],
    parallel: Callable[[int], Parallel | None] = lambda _seed: None,
) -> CountRange:
    """The final `plan` (already shown to pass and be minimal on `point_seed`) judged on `extra_seeds` (module docstring);
    `parallel(seed)`: how to simulate that seed's scenarios several at a time."""
    return seeded_range(
        plan, point_seed, [seed_check(plan, run, judge, seed, parallel(seed)) for seed in extra_seeds], spreads
    )


def seed_check(
    plan: CapacityPlan, run: RunSeed, judge: Judge, seed: int, parallel: Parallel | None = None
) -> SeedCheck:
    """`plan`'s scenarios, and each pool with one instance fewer, on `seed`."""
    cache: dict[tuple, EvalResult] = {}

    def on_seed(counts: Counts) -> EvalResult:
        return run(counts, seed)

    failed = next((r for r in check(plan, on_seed, judge, cache, parallel) if not r.passed), None)
    fewer = []
    for pool in plan.pools:
        if pool.instances > 1 and all(
            r.passed for r in check(plan.with_counts({pool.name: pool.instances - 1}), on_seed, judge, cache, parallel)
        ):
            fewer.append(pool.name)
    return SeedCheck(seed, failed, tuple(fewer))


def seeded_range(
    plan: CapacityPlan, point_seed: int, checks: Sequence[SeedCheck], spreads: Sequence[PoolSpread]
) -> CountRange:
    """The count range of `plan` from its extra seeds' `checks` (module docstring)."""
    low = high = plan.total_gpus
    for c in checks:
        if c.failed is not None:
            high = max(high, plan.total_gpus + plan.pool(c.failed.blame).pool.gpus_per_instance)
        low = min(low, plan.total_gpus - sum(plan.pool(p).pool.gpus_per_instance for p in c.fewer_passes))
    return CountRange(
        plan.total_gpus, low, high, (point_seed, *(c.seed for c in checks)), tuple(checks), tuple(spreads)
    )
