"""The state one plan's sizing shares (`Sizer`: the trace, its planning traffic, the params, the executor) and its
phases as `llmcap.sizing.plan` runs them: aggregated candidates by branch and bound (`aggregated`), the whole-trace
confirmation of the cheapest (`confirm_cheapest`), the scenario fit of the shortlisted shapes (`scenarios`, its
finalists in `llmcap.sizing.finalists`), the choice among them (`pick`), the count range (`count_range`) and the
replay of the planned deployment (`replay`). The disaggregated roles are searched in `llmcap.sizing.pd_search`, on
this state."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from llmcap.catalog import ModelSpec
from llmcap.catalog.gpus import default_catalog_dir
from llmcap.perf.model_error import model_error
from llmcap.perf.scaled import ScaledStepModel
from llmcap.sim import LinkConfig, SimConfig, SimResult
from llmcap.sizing.availability import states as availability_states
from llmcap.sizing.checked import CheckedTraffic, checked_traffic
from llmcap.sizing.deployed import Deployed, FitJob, Job, PdFactory, SeedJob, WholeTrace, run_job
from llmcap.sizing.executor import Executor
from llmcap.sizing.finalists import Finalist, Settled, Shortlist, analytic_cost, closeness
from llmcap.sizing.headroom import CapacityPlan, PlanningTraffic, PoolInput, plan_pools
from llmcap.sizing.measured import MeasuredModels
from llmcap.sizing.nearmiss import NearMiss, NoFeasiblePlan, idle_miss, near_misses
from llmcap.sizing.params import SizeParams
from llmcap.sizing.planned import PlannedDeployment, step_model_record
from llmcap.sizing.scenarios import FitResult, Judge, Minimality, Parallel
from llmcap.sizing.scenarios import scenarios as scenario_list
from llmcap.sizing.search import SearchResult, SearchTask, confirm_max_rate, evaluate_at, search_candidates
from llmcap.sizing.simeval import SimEvaluate
from llmcap.sizing.uncertainty import CountRange, ModelErrorEnd, pool_spread, seed_max_rates, seeded_range
from llmcap.sizing.units import (
    Lengths,
    RoleRow,
    SizedRow,
    Unit,
    make_unit,
    search_metric,
    unit_evaluate,
)


class Sizer:
    """State shared by the phases of one plan's sizing; `traffic`: its planning traffic (`planning_traffic`)."""

    def __init__(
        self,
        trace: pa.Table,
        model: ModelSpec,
        params: SizeParams,
        traffic: PlanningTraffic,
        executor: Executor | None,
        say: Callable[[str], None],
        measured: MeasuredModels | None,
    ):
        self.trace, self.model, self.params, self.executor, self.say = trace, model, params, executor, say
        self.measured = measured
        self.lengths = Lengths.of(trace)
        self.traffic = traffic  # every plan's pools are sized from it (`plan`)
        self.checked = checked_traffic(trace, params.whole_trace_max_requests)  # what whole-deployment checks replay
        self.notes: list[str] = []
        self.roles: list[RoleRow] = []
        self.idle_misses: list[
            NearMiss
        ] = []  # rows ruled out before any simulation: not even idle do they meet the SLOs

    @property
    def target(self) -> float:
        return self.traffic.target_rps

    @property
    def planning(self) -> float:
        return self.traffic.planning_rps

    def evaluate(self, unit: Unit, replicas: int = 1, excerpt: int | None = None) -> SimEvaluate:
        return unit_evaluate(self.trace, self.params, unit, replicas=replicas, excerpt=excerpt)

    def whole_evaluate(self, unit: Unit) -> SimEvaluate:
        """One instance of `unit` replaying the checked traffic (the whole trace or its busiest span) at every rate."""
        c = self.checked
        return WholeTrace(c.trace, self.params, unit, rate_factor=c.rate_factor)({"instances": 1})

    def search_task(self, unit: Unit, best_per_gpu: float = 0.0) -> SearchTask:
        """One instance's search from half its analytic bound (confirmed on the whole trace in mode "all"), cut
        short when it fails at the rate it needs to beat `best_per_gpu` (branch and bound on measured rates)."""
        p, ev = self.params, self.evaluate(unit)
        confirm = self.whole_evaluate(unit) if p.confirm_whole_trace == "all" else None
        floor = best_per_gpu * unit.gpus if best_per_gpu > 0 and p.confirm_whole_trace != "all" else None
        return SearchTask(unit.key, ev, p.slo.attainment_target, p.search, 0.5 * unit.bounds.rate, confirm, floor)

    def pool(self, name: str, unit: Unit, rate: float, kv_from: SearchResult | None) -> PoolInput:
        """A pool of `unit` at `rate` req/s per instance; `kv_from`: the search whose KV P99 applies (KV-holding pools)."""
        p99 = None if kv_from is None else search_metric(kv_from, "kv_tokens_p99")
        cap = None if kv_from is None else float(unit.row["kv_tokens_per_instance"])
        return PoolInput(name, rate, unit.gpus, unit.gpu.gpus_per_node, unit.gpu.usd_per_gpu_hour, p99, cap)

    def plan(self, pools: Sequence[PoolInput]) -> CapacityPlan:
        return plan_pools(self.traffic.demand, tuple(pools), self.params.headroom)

    def sized(self, row: SizedRow, result: SearchResult) -> SizedRow:
        """Aggregated `row` with `result` and the plan for its max rate (none at rate 0); a confirmation is noted."""
        if result.confirmation is not None:
            self.notes.append(f"whole-trace confirmation of {row.key}: {result.confirmation.describe()}")
        plan = self.plan([self.pool("instances", row.unit, result.max_rate, result)]) if result.max_rate > 0 else None
        return replace(row, result=result, plan=plan)

    def confirm(self, row: SizedRow) -> SizedRow:
        """`row` with its max rate confirmed on the whole trace (`confirm_max_rate`) and its plan redone."""
        assert row.whole_trace is not None
        self.say(f"confirming {row.key} on the whole trace")
        return self.sized(row, confirm_max_rate(row.whole_trace, row.result, self.params.search, self.executor))

    def aggregated(self, rows: pd.DataFrame, incumbent: float) -> list[SizedRow]:
        """Branch and bound in rounds of `shortlist`: simulate candidates by analytic bound per GPU (the best
        of each parallel layout first) while their bound can still beat the best goodput per GPU found so
        far (`incumbent` seeds it, e.g. from the P/D search), up to `max_simulated`."""
        p = self.params
        units = [
            make_unit(self.model, r, self.lengths, p.slo, self.measured, p.admission_policy, p.prefix_tiers)
            for _, r in rows.iterrows()
        ]
        for u in units:
            if u.unloaded_attainment < p.slo.attainment_target:
                self.notes.append(
                    f"pruned {u.key}: even idle only {u.unloaded_attainment:.1%} of requests meet the SLOs"
                )
                self.idle_misses.append(idle_miss(u.key, u.unloaded_attainment, p.slo))
        itl_s = math.inf if p.slo.itl_ms is None else p.slo.itl_ms * 1e-3

        def stalls(u: Unit) -> bool:  # a full chunk's step alone is longer than the ITL target
            return u.chunk_step_s > itl_s

        viable = sorted(
            (u for u in units if u.unloaded_attainment >= p.slo.attainment_target),
            key=lambda u: (stalls(u), -u.bound_per_gpu, u.key),
        )
        # Rounds take the best of each parallel layout first (GPU, TP, PP, EP), so variants of one layout
        # (KV dtype, chunk size) do not use up the budget before other layouts are tried. Within a layout a
        # chunk whose step fits the ITL target comes first: a larger chunk has the better prefill bound, but
        # every decode sharing its step waits for it (long prompts then stall decodes past the target).
        rank: dict[tuple, int] = {}
        order = []
        for u in viable:
            layout = (u.row["gpu"], int(u.row["tp"]), int(u.row["pp"]), int(u.row["ep"]))
            order.append((rank.get(layout, 0), -u.bound_per_gpu, u.key, u))
            rank[layout] = rank.get(layout, 0) + 1
        queue = [u for *_, u in sorted(order, key=lambda t: t[:3])]
        self.say(
            f"aggregated: {len(queue)} candidates can meet the SLOs when idle; simulating by analytic bound per GPU"
        )
        out: list[SizedRow] = []
        best = incumbent
        bounded: list[Unit] = []
        while len(out) < p.max_simulated:
            bounded += [u for u in queue if u.bound_per_gpu <= best]
            queue = [u for u in queue if u.bound_per_gpu > best]
            if not queue:
                break
            n = min(p.shortlist, p.max_simulated - len(out))
            batch, queue = queue[:n], queue[n:]
            tasks = [self.search_task(u, best) for u in batch]
            results = search_candidates(tasks, self.executor)
            for u in batch:
                res = results[u.key]
                if res.status == "below_floor":
                    self.notes.append(
                        f"stopped {u.key}: fails at {res.upper_rate:.4g} req/s, the rate it needs to beat the best goodput per GPU found"
                    )
                row = SizedRow(u.key, "aggregated", res, None, u, whole_trace=self.whole_evaluate(u))
                out.append(self.sized(row, res))
                if res.best is not None and res.max_rate > 0:
                    best = max(best, res.max_rate * res.best.mean_attainment / u.gpus)
        for u in bounded:
            self.notes.append(
                f"pruned {u.key}: analytic bound {u.bound_per_gpu:.3g} req/s per GPU ({u.bounds.binding}) cannot beat the best goodput found"
            )
        for u in queue:
            self.notes.append(
                f"not simulated {u.key} (bound {u.bound_per_gpu:.3g} req/s per GPU): max_simulated {p.max_simulated} reached"
            )
        return out

    def pd_factory(self, prefill: Unit, decode: Unit) -> PdFactory:
        link = LinkConfig(
            bandwidth_bytes_s=prefill.gpu.nic_bytes_s * prefill.gpus, latency_s=self.params.pd_link_latency_s
        )
        return PdFactory(self.trace, prefill, decode, link, self.params)

    def confirm_cheapest(self, rows: list[SizedRow]) -> tuple[SizedRow, list[SizedRow]]:
        """The cheapest sized row; in mode "chosen" an aggregated one is confirmed on the whole trace first,
        re-choosing while a confirmation steps the cheapest down (each row is confirmed at most once). A P/D
        pairing needs no confirmation: its whole deployment is simulated in every scenario."""
        while True:
            sized = [r for r in rows if r.plan is not None]
            if not sized:
                searched = [(r.key, r.result) for r in rows if r.mode == "aggregated"] + [
                    (f"{q.role}: {q.unit.key}", q.result) for q in self.roles
                ]
                raise NoFeasiblePlan(near_misses(searched, self.params.slo, self.idle_misses))
            chosen = min(sized, key=analytic_cost)
            if (
                self.params.confirm_whole_trace == "off"
                or chosen.result.confirmation is not None
                or chosen.whole_trace is None
            ):
                break
            rows = [self.confirm(r) if r is chosen else r for r in rows]
        unconfirmed = [
            r.key for r in rows if r.mode == "aggregated" and r.result.confirmation is None and r.result.max_rate > 0
        ]
        if unconfirmed:
            self.notes.append(
                f"max rates from excerpts only (not confirmed on the whole trace): {', '.join(unconfirmed)}"
            )
        return chosen, rows

    def replay(self, row: SizedRow, plan: CapacityPlan) -> SimResult:
        """`row`'s deployment at `plan`'s counts, simulated on the whole trace (even where the checks replay its busiest
        span) at the planning rate."""
        whole = self._whole_trace(row, checked_traffic(self.trace, 0))
        return whole(plan.counts()).simulate(plan.planning_rps, self.params.search.seeds[0])

    def _whole_trace(self, row: SizedRow, checked: CheckedTraffic | None = None) -> WholeTrace:
        """Serving instances per pool → `row`'s deployment replaying `checked` (default: the sizer's, the whole trace or
        its busiest span) on the planning clock (with the sizer's router now)."""
        c = checked or self.checked
        trace, rate_factor = c.trace, c.rate_factor
        if row.decode is None:
            return WholeTrace(trace, self.params, row.unit, rate_factor=rate_factor)
        pd = replace(self.pd_factory(row.unit, row.decode), trace=trace, whole_trace=True, rate_factor=rate_factor)
        return WholeTrace(trace, self.params, row.unit, pd, rate_factor)

    def planned(self, row: SizedRow, plan: CapacityPlan) -> PlannedDeployment:
        """`row`'s deployment at `plan`'s counts as the record `llmcap simulate --plan` replays (`llmcap.sizing.planned`)."""
        ev = self._whole_trace(row)(plan.counts())
        config = SimConfig(engine=ev.engine, replicas=ev.replicas, router=ev.router, pd=ev.pd)
        if row.decode is None:
            steps = {"instances": step_model_record(row.unit.step_model, row.unit.row)}
        else:
            steps = {
                "prefill": step_model_record(row.unit.step_model, row.unit.row),
                "decode": step_model_record(row.decode.step_model, row.decode.row),
            }
        named = {s.name: s.counts() for s in scenario_list(plan)}
        # a catalog model by its name: an absolute path would differ between checkouts (and break reproduction)
        in_catalog = Path(self.model.source).resolve().parent.parent == (default_catalog_dir() / "models").resolve()
        ref = self.model.name if in_catalog else self.model.source
        states = availability_states(plan) if self.params.slo.availability is not None else ()
        return PlannedDeployment(
            ref, plan.planning_rps, self.params.search.seeds[0], config, steps, named, self.params.slo, states
        )

    def deployment(self, row: SizedRow) -> tuple[Deployed, Judge]:
        """`row`'s deployment simulated on the whole trace at the planning rate, (counts, seed) → evaluation, and
        the judge of its scenarios."""
        assert row.plan is not None
        p = self.params
        kv_pool, prefill_pool = ("instances", None) if row.decode is None else ("decode", "prefill")
        judge = Judge(p.slo.attainment_target, p.headroom.kv_safe_fraction, kv_pool, prefill_pool, p.slo.availability)
        return Deployed(self._whole_trace(row), row.plan.planning_rps), judge

    def parallel(self, run: Deployed, seed: int) -> Parallel | None:
        """`run`'s deployments on `seed` simulated across the executor's workers (None: one at a time)."""
        executor = self.executor
        width = executor.slots() if executor is not None else 1
        if executor is None or width <= 1:
            return None
        return Parallel(lambda many: executor.map(evaluate_at, [(run.whole(c), run.rate, seed) for c in many]), width)

    def jobs(self, jobs: Sequence[Job]) -> list[Any]:
        """Independent fits and seed checks. Several, with more than one worker: each runs whole on a worker (its
        simulations one after another there, no scenario simulated past a failing one), fits first (the longer).
        Else one after another here, each one's simulations spread over the workers (`parallel`). The same
        results either way; each job's `notes` are said before it runs (all at once when on workers)."""
        executor = self.executor
        if executor is not None and executor.slots() > 1 and len(jobs) > 1:
            for job in jobs:
                for note in job.notes:
                    self.say(note)
            order = sorted(range(len(jobs)), key=lambda i: not isinstance(jobs[i], FitJob))
            done = executor.map(run_job, [jobs[i] for i in order])
            out: list[Any] = [None] * len(jobs)
            for i, result in zip(order, done, strict=True):
                out[i] = result
            return out
        results = []
        for job in jobs:
            for note in job.notes:
                self.say(note)
            results.append(job(self.parallel(job.run, job.seed)))
        return results

    def cost_limit(self, row: SizedRow) -> float:
        """The most `row`'s scenario fit may spend ($/h): `max_cost_factor` × its analytic plan, within `max_usd_per_hour`."""
        assert row.plan is not None
        p = self.params
        return min(
            p.max_cost_factor * row.plan.usd_per_hour, math.inf if p.max_usd_per_hour is None else p.max_usd_per_hour
        )

    def fit_job(
        self, row: SizedRow, known_failing: Mapping[str, int] | None = None, notes: tuple[str, ...] = ()
    ) -> FitJob:
        """`row`'s plan to be simulated end to end in every scenario, grown until all pass (within its cost limit), each
        pool settled at its minimum (`known_failing`: counts known to fail, where the bisection may start)."""
        assert row.plan is not None
        run, judge = self.deployment(row)
        say = f"simulating the scenarios of {row.key} on the whole trace at {row.plan.planning_rps:.4g} req/s"
        return FitJob(
            (*notes, say), run, self.params.search.seeds[0], row.plan, judge, self.cost_limit(row), known_failing
        )

    def fit(self, row: SizedRow, known_failing: Mapping[str, int] | None = None) -> FitResult:
        """`fit_job(row, known_failing)`, run."""
        fitted: FitResult = self.jobs([self.fit_job(row, known_failing)])[0]
        return fitted

    def routers(self) -> list[str]:
        """The routers the chosen plan is fitted with: `router`, and prefix_aware where the trace has prefix hashes."""
        p = self.params
        if p.prefix_routing == "search" and self.lengths.hashes is not None and p.router != "prefix_aware":
            return [p.router, "prefix_aware"]
        return [p.router]

    def scenarios(self, rows: list[SizedRow]) -> Shortlist:
        """The `final_shortlist` cheapest shapes by analytic plan, each fitted on the whole trace in every scenario
        (`fit_job`), run together (`jobs`)."""
        sized = sorted((r for r in rows if r.plan is not None), key=analytic_cost)
        shapes = sized[: self.params.final_shortlist]
        self.say(f"settling the counts of {len(shapes)} shape(s) on the whole trace in every scenario")
        finalists = [Finalist(r, f) for r, f in zip(shapes, self.jobs([self.fit_job(r) for r in shapes]), strict=True)]
        return Shortlist(tuple(finalists), len(sized), sized[len(shapes)] if len(sized) > len(shapes) else None)

    def pick(self, shortlist: Shortlist) -> Settled:
        """The cheapest finalist whose fit passes, fitted again under the other routers (`routers()`), the router needing
        the cheaper passing plan kept. With none passing, the closest miss is `chosen` and `ok` is False: the plan
        shown is not an answer."""
        finalists = list(shortlist.finalists)
        passing = [f for f in finalists if f.fit.ok]
        chosen = (
            min(passing, key=lambda f: (f.fit.plan.usd_per_hour, finalists.index(f)))
            if passing
            else max(finalists, key=closeness)
        )
        routers: dict[str, dict[str, Any]] = {}
        if chosen.fit.ok and len(self.routers()) > 1:
            chosen, routers = self._routed(chosen)
            finalists = [
                chosen if f.row.key == chosen.row.key else f for f in finalists
            ]  # its fit under the router kept
        following = shortlist.following
        if following is not None:
            assert following.plan is not None
            self.notes.append(
                f"settled on the whole trace: the {len(shortlist.finalists)} cheapest analytic plans of {shortlist.considered} (final_shortlist); "
                f"the next, {following.key}, started at ${following.plan.usd_per_hour:,.2f}/h"
            )
        return Settled(chosen, tuple(finalists), routers)

    def _routed(self, chosen: Finalist) -> tuple[Finalist, dict[str, dict[str, Any]]]:
        """`chosen` fitted under each of `routers()` (its fit under `router` is already known); the one whose plan
        passes and costs least is kept (ties: the configured router) and from then on is the sizer's router."""
        base, fits = self.params, {self.params.router: chosen.fit}
        for router in self.routers()[1:]:
            self.params = base.model_copy(update={"router": router})
            fits[router] = self.fit(chosen.row)
        order = list(fits)
        best = min(order, key=lambda r: (not fits[r].ok, fits[r].plan.usd_per_hour, order.index(r)))
        self.params = base.model_copy(update={"router": best})
        compared = {
            r: {"gpus": f.plan.total_gpus, "usd_per_hour": f.plan.usd_per_hour, "scenarios_pass": f.ok}
            for r, f in fits.items()
        }
        tried = "; ".join(
            f"{r} {c['gpus']} GPUs (${c['usd_per_hour']:,.0f}/h){'' if c['scenarios_pass'] else ', scenarios not all met'}"
            for r, c in compared.items()
        )
        self.notes.append(f"routing searched on the chosen plan: {tried} → {best}")
        return Finalist(chosen.row, fits[best]), compared

    def count_range(self, row: SizedRow, minimal: Sequence[Minimality] = ()) -> CountRange:
        """The fitted plan judged on `count_seeds` too, each pool's seed spread of G (`llmcap.sizing.uncertainty`),
        and the plan fitted again at the ends of the step-time model's error (`model_error_jobs`): independent
        jobs, run together (`jobs`)."""
        assert row.plan is not None
        if row.pd_roles is None:
            spreads = [pool_spread("instances", seed_max_rates(row.result), self.target)]
        else:
            spreads = [
                pool_spread(r.role, {s: g / r.instances for s, g in seed_max_rates(r.result).items()}, self.target)
                for r in row.pd_roles
            ]
        run, judge = self.deployment(row)
        seeds = [s for s in self.params.count_seeds if s != self.params.search.seeds[0]]
        said = (
            (f"simulating the plan's scenarios on seeds {', '.join(map(str, seeds))} for the count's range",)
            if seeds
            else ()
        )
        checks: list[Job] = [
            SeedJob(said if i == 0 else (), run, seed, row.plan, judge) for i, seed in enumerate(seeds)
        ]
        ends, fits, note = self.model_error_jobs(row, minimal)
        done = self.jobs([*checks, *fits])
        fitted = done[len(checks) :]
        ended = tuple(
            replace(e, gpus=f.plan.total_gpus if f.ok else None, counts=f.plan.counts())
            for e, f in zip(ends, fitted, strict=True)
        )
        return replace(
            seeded_range(row.plan, self.params.search.seeds[0], done[: len(checks)], spreads),
            model_error=ended,
            model_error_note=note,
        )

    def model_error_jobs(
        self, row: SizedRow, minimal: Sequence[Minimality] = ()
    ) -> tuple[list[ModelErrorEnd], list[Job], str]:
        """`row`'s plan to be fitted again with each pool's step times × (1 ∓ its model's known error) (`llmcap.sizing.uncertainty`):
        each end (its count left to the fit) and its fit; `minimal`: the plan's one-fewer evidence (a count that fails at
        the model's own speed fails slower too). Without ends, why not."""
        assert row.plan is not None
        if not self.params.model_error_range:
            return (
                [],
                [],
                "step-time model error: not simulated (size.model_error_range: false); the range is seeds only",
            )
        units = {"instances": row.unit} if row.decode is None else {"prefill": row.unit, "decode": row.decode}
        errors = {pool: model_error(u.step_model) for pool, u in units.items()}
        unknown = [pool for pool, e in errors.items() if e is None]
        if unknown:
            return (
                [],
                [],
                f"step-time model error: not measured for the {', '.join(unknown)} pool's step model; its range is seeds only",
            )
        ends: list[ModelErrorEnd] = []
        fits: list[Job] = []
        for end, sign in (("faster", -1.0), ("slower", 1.0)):
            factors = {pool: 1.0 + sign * e.relative for pool, e in errors.items() if e is not None}
            scaled = {
                pool: replace(u, step_model=ScaledStepModel(u.step_model, factors[pool])) for pool, u in units.items()
            }
            variant = replace(
                row, unit=scaled["instances" if row.decode is None else "prefill"], decode=scaled.get("decode")
            )
            known = {m.pool: m.instances for m in minimal if m.failed is not None} if sign > 0 else None
            fits.append(
                self.fit_job(variant, known, (f"fitting the plan with step times {end} by the model's own error",))
            )
            ends.append(ModelErrorEnd(end, factors, {p: e.basis for p, e in errors.items() if e is not None}, None, {}))
        return ends, fits, ""
