"""A sized row's deployment on the whole trace as plain data (classes, not closures, so they pickle to process or
Dask workers), and the jobs over it that can run whole on a worker: a scenario fit, a seed's check."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from llmcap.first_token import first_token_from
from llmcap.sim import LinkConfig, PDConfig
from llmcap.sizing.headroom import CapacityPlan
from llmcap.sizing.params import SizeParams
from llmcap.sizing.scenarios import FitResult, Judge, Parallel
from llmcap.sizing.scenarios import fit as fit_scenarios
from llmcap.sizing.search import EvalResult
from llmcap.sizing.simeval import SimEvaluate
from llmcap.sizing.uncertainty import SeedCheck, seed_check
from llmcap.sizing.units import Unit, unit_evaluate


@dataclass(frozen=True)
class PdFactory:
    """(n_P, n_D) → evaluate of that P/D deployment (a class, not a closure, so it pickles to workers)."""

    trace: pa.Table
    prefill: Unit
    decode: Unit
    link: LinkConfig
    params: SizeParams
    whole_trace: bool = False  # evaluates that replay the whole trace (scenarios)
    rate_factor: float = 1.0  # `trace`'s mean rate ÷ the planning trace's (`llmcap.sizing.checked`)

    def __call__(self, n_p: int, n_d: int) -> SimEvaluate:
        pd_cfg = PDConfig(
            prefill_replicas=n_p,
            decode_replicas=n_d,
            link=self.link,
            first_token_from=first_token_from(self.params.slo.ttft_includes_handoff),
            decode_engine=self.decode.engine,
        )
        ev = unit_evaluate(
            self.trace, self.params, self.prefill, pd=pd_cfg, decode=self.decode, rate_factor=self.rate_factor
        )
        return ev.whole_trace() if self.whole_trace else ev


@dataclass(frozen=True)
class WholeTrace:
    """Serving instances per pool → a sized row's deployment replaying all of `trace` (the whole trace or its busiest
    span, `llmcap.sizing.checked`; a class, not a closure, so it pickles to workers): `unit`'s instances, or with
    `pd` that factory's P/D pools."""

    trace: pa.Table
    params: SizeParams
    unit: Unit
    pd: PdFactory | None = None
    rate_factor: float = 1.0  # `trace`'s mean rate ÷ the planning trace's

    def __call__(self, counts: Mapping[str, int]) -> SimEvaluate:
        if self.pd is None:
            return unit_evaluate(
                self.trace,
                self.params,
                self.unit,
                replicas=counts["instances"],
                excerpt=self.trace.num_rows,
                rate_factor=self.rate_factor,
            )
        return self.pd(counts["prefill"], counts["decode"])


@dataclass(frozen=True)
class Deployed:
    """(serving instances per pool, seed) → `whole`'s deployment evaluated at `rate` (`llmcap.sizing.uncertainty.RunSeed`)."""

    whole: WholeTrace
    rate: float

    def __call__(self, counts: Mapping[str, int], seed: int) -> EvalResult:
        return self.whole(counts)(self.rate, seed)


@dataclass(frozen=True)
class FitJob:
    """A scenario fit on `seed` (`llmcap.sizing.scenarios.fit`), to run here or whole on a worker."""

    notes: tuple[str, ...]  # said before it runs
    run: Deployed
    seed: int
    plan: CapacityPlan
    judge: Judge
    limit_usd_per_hour: float
    known_failing: Mapping[str, int] | None = None

    def __call__(self, parallel: Parallel | None = None) -> FitResult:
        run, seed = self.run, self.seed
        return fit_scenarios(
            self.plan,
            lambda counts: run(counts, seed),
            self.judge,
            self.limit_usd_per_hour,
            parallel,
            self.known_failing,
        )


@dataclass(frozen=True)
class SeedJob:
    """A plan's scenarios, and one fewer per pool, on another seed (`llmcap.sizing.uncertainty.seed_check`)."""

    notes: tuple[str, ...]
    run: Deployed
    seed: int
    plan: CapacityPlan
    judge: Judge

    def __call__(self, parallel: Parallel | None = None) -> SeedCheck:
        return seed_check(self.plan, self.run, self.judge, self.seed, parallel)


Job = FitJob | SeedJob


def run_job(job: Job) -> FitResult | SeedCheck:
    """`job` run whole on a worker, its simulations one after another."""
    return job()
