"""The planned deployment simulated end to end in each headroom scenario, grown until all pass, then shown minimal.

Scenarios (`llmcap.sizing.headroom`), each the whole trace replayed at the planning rate (P/D included:
prefill queues, the KV handoff, decode KV):
- "traffic": every planned instance serving;
- "node loss: <pool>": that pool without the instances on its fullest `node_failures` node(s);
- "upgrade: <pool>": that pool without its max_surge + max_unavailable instances of one upgrade step;
- "availability" (with `slo.availability`): every instance serving and each pool with a node down, weighted by
  the share of time each lasts (`llmcap.sizing.availability`), judged last, against the availability target.
A scenario passes when attainment ≥ the target, the run is stable (`llmcap.sizing.stability`) and meets
its run-level targets (token-level ITL), and the
KV-holding pool's P99 KV tokens per instance stay ≤ kv_safe_fraction × capacity. Scenarios that serve the
same instances are one simulation. While the fit searches, a scenario serving at least as many instances in every
pool as one that passed is taken to pass unsimulated (for P/D, the two thinnest scenarios stand for the five); the
plan it ends on has every scenario simulated.

Fit: while a scenario fails, instances are added to the pool it points at (the pool the scenario takes
instances from; the traffic scenario's misses: TTFT the prefill pool, ITL and KV the decode pool): one, then
twice as many each time the same pool is grown again (a plan far below its need gets there in a few
simulations), and at least enough that the scenario leaves one more instance serving (a node holds several),
up to a stated cost limit ($/h) and no other cap. With two pools (P/D) the failing scenario is also simulated
with the other pool grown, and the growth that raises its attainment more (by `PROGRESS_STEP`) is kept: a
node loss in the prefill pool may be the decode pool's to fix. Then minimality, pool by pool: the count is
bisected between the highest count seen failing and the passing one, then one instance fewer is tried at
the others' final counts; when every scenario still passes the pool shrinks and the check repeats (attainment
is assumed monotone in the count only to skip counts: every claim of minimality is the one-fewer run
itself). Pools are settled in turn until none moves (P/D: the counts are coupled). The first failing
scenario at one fewer is the evidence that the count is minimal.

With `Parallel`, a check simulates its next scenarios `width` at a time (a process pool or a Dask cluster):
the same results in the same order, at most width − 1 simulations spent past a failing scenario.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from llmcap.sizing import availability
from llmcap.sizing.availability import State
from llmcap.sizing.headroom import CapacityPlan
from llmcap.sizing.search import EvalResult

Counts = Mapping[str, int]
RunDeployment = Callable[[Counts], EvalResult]
"""Serving instances per pool → the whole-trace evaluation of that deployment at the planning rate."""


@dataclass(frozen=True)
class Parallel:
    """`run_many(deployments)`: their evaluations (the same as `run` one by one), `width` at a time."""

    run_many: Callable[[Sequence[Counts]], list[EvalResult]]
    width: int


@dataclass(frozen=True)
class Scenario:
    name: str
    serving: tuple[tuple[str, int], ...]  # (pool, serving instances), in the plan's pool order
    reasoning: str
    reduced: str = ""  # the pool this scenario takes instances from ("" = none)
    states: tuple[State, ...] = ()  # availability: the deployments it is judged on over time (none: `serving` alone)

    def counts(self) -> dict[str, int]:
        return dict(self.serving)

    def deployments(self) -> tuple[tuple[tuple[str, int], ...], ...]:
        """What must be simulated to judge it."""
        return tuple(s.serving for s in self.states) or (self.serving,)


@dataclass(frozen=True)
class ScenarioResult:
    scenario: Scenario
    attainment: float
    overload: str
    run_miss: str  # a run-level target missed (token-level ITL)
    kv_p99_share: float | None  # P99 KV tokens per instance ÷ capacity of the KV-holding pool
    passed: bool
    blame: str  # the pool a failure points at ("" when it passed)
    detail: str = ""  # availability: the target and what each state serves

    def describe(self) -> str:
        kv = "" if self.kv_p99_share is None else f", KV p99 {self.kv_p99_share:.0%}"
        why = f" (overloaded: {self.overload})" if self.overload else ""
        why += f" ({self.run_miss})" if self.run_miss else ""
        why += f" ({self.detail})" if self.detail else ""
        return f"{self.scenario.name} [{_counts_txt(self.scenario.counts())}]: attainment {self.attainment:.4f}{kv} → {'pass' if self.passed else 'FAIL'}{why}"


def _counts_txt(counts: Counts) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def scenarios(plan: CapacityPlan, over_time: bool = False) -> list[Scenario]:
    """The module docstring's scenarios of `plan` (pools with nothing left serving are kept at 0: they fail);
    `over_time`: with the availability scenario."""
    base = plan.counts()
    out = [Scenario("traffic", tuple(base.items()), f"all planned instances at {plan.planning_rps:.4g} req/s")]
    for pool in plan.pools:
        for kind, lost, why in (
            (
                "node loss",
                pool.node_loss,
                f"the fullest {pool.params.node_failures} node(s) of the {pool.name} pool lost",
            ),
            ("upgrade", pool.upgrading, f"one rolling-upgrade step of the {pool.name} pool out of service"),
        ):
            if lost > 0:
                serving = {**base, pool.name: pool.instances - lost}
                out.append(Scenario(f"{kind}: {pool.name}", tuple(serving.items()), f"{why}: −{lost}", pool.name))
    if over_time:
        mix = availability.states(plan)
        down = ", ".join(f"{s.down} node down {s.share:.3%}" for s in mix if s.down)
        out.append(
            Scenario(
                "availability",
                tuple(base.items()),
                f"over time: {down} of the time" if down else "over time: no node is ever down",
                "",
                mix,
            )
        )
    return out


@dataclass(frozen=True)
class Judge:
    """Turns one evaluation into a verdict for a scenario."""

    attainment_target: float
    kv_safe_fraction: float
    kv_pool: str  # the pool whose KV is checked ("instances" or "decode")
    prefill_pool: str | None  # P/D: where TTFT misses point
    availability: float | None = None  # slo.availability: the availability scenario is judged against it

    def judged(self, scenario: Scenario, cache: Mapping[tuple, EvalResult]) -> ScenarioResult:
        """`scenario` judged on its simulations in `cache`."""
        if not scenario.states:
            return self(scenario, cache[scenario.serving])
        assert self.availability is not None, "an availability scenario needs the target"
        judged = [(s, cache[s.serving]) for s in scenario.states]
        share = availability.availability(judged)
        passed = share >= self.availability
        blame = ""
        if not passed:  # the state that loses the most requests: its pool, or the traffic's own misses
            state, r = availability.costliest(judged)
            blame = state.down or self._blame(r, self._kv_ok(r))
        detail = f"{'≥' if passed else '<'} {self.availability:g}: {availability.describe(judged)}"
        return ScenarioResult(scenario, share, "", "", None, passed, blame, detail)

    def _kv_ok(self, r: EvalResult) -> bool:
        share = r.metrics.get("kv_p99_share")
        return share is None or share <= self.kv_safe_fraction

    def __call__(self, scenario: Scenario, r: EvalResult) -> ScenarioResult:
        share = r.metrics.get("kv_p99_share")
        kv_ok = self._kv_ok(r)
        passed = r.attainment >= self.attainment_target and r.run_ok and kv_ok
        blame = ""
        if not passed:
            blame = scenario.reduced or self._blame(r, kv_ok)
        return ScenarioResult(scenario, r.attainment, r.overload, r.run_miss, share, passed, blame)

    def _blame(self, r: EvalResult, kv_ok: bool) -> str:
        if self.prefill_pool is None:
            return self.kv_pool
        if (
            r.run_miss
        ):  # run-level targets missed: prefill's when every one is TTFT or queue time (`DistributionCheck.miss_line`)
            prefill_side = all(part.startswith(("TTFT ", "queue time ")) for part in r.run_miss.split("; "))
            return self.prefill_pool if kv_ok and prefill_side else self.kv_pool
        ttft, itl = r.metrics.get("ttft_misses", 0.0), r.metrics.get("itl_misses", 0.0)
        return self.prefill_pool if kv_ok and ttft >= itl else self.kv_pool


def _simulate(
    keys: Sequence[tuple], run: RunDeployment, cache: dict[tuple, EvalResult], parallel: Parallel | None
) -> None:
    """Each deployment of `keys` (serving tuples) not in `cache` into it: one with a pool left at 0 fails unsimulated,
    the rest are simulated, `parallel.width` at a time when given."""
    todo = []
    for key in dict.fromkeys(keys):
        if key in cache:
            continue
        empty = [p for p, n in key if n <= 0]
        if empty:
            cache[key] = EvalResult(0.0, overload=f"no {empty[0]} instance left serving")
        else:
            todo.append(key)
    if parallel is not None and parallel.width > 1:
        for i in range(0, len(todo), parallel.width):
            batch = todo[i : i + parallel.width]
            cache.update(zip(batch, parallel.run_many([dict(k) for k in batch]), strict=True))
    else:
        for key in todo:
            cache[key] = run(dict(key))


def _dominates(thin: Scenario, sc: Scenario) -> bool:
    """Whether `thin` serves no more instances than `sc` in any pool: with attainment monotone in the counts, `sc`
    passes when `thin` does. Availability scenarios are judged on their own mix: never either side."""
    here = dict(sc.serving)
    return not sc.states and not thin.states and all(here[p] >= n for p, n in thin.serving)


def check(
    plan: CapacityPlan,
    run: RunDeployment,
    judge: Judge,
    cache: dict[tuple, EvalResult],
    parallel: Parallel | None = None,
    complete: bool = True,
) -> list[ScenarioResult]:
    """Every scenario of `plan`, simulated once per distinct deployment (`cache` across calls); stops at the first failure
    (with `parallel`, the next scenarios are simulated together with the one needed now). `complete` False (a probe
    of the fit's search): a scenario another one dominates (`_dominates`) is left out, not simulated."""
    out: list[ScenarioResult] = []
    # the thinnest deployment first: likeliest to fail (availability, appended last with every instance serving, stays last)
    order = sorted(scenarios(plan, judge.availability is not None), key=lambda s: sum(n for _, n in s.serving))
    if not complete:
        # a scenario dominated by an earlier one is reached only when that one passed (the check stops at a failure)
        kept: list[Scenario] = []
        for sc in order:
            if not any(_dominates(thin, sc) for thin in kept):
                kept.append(sc)
        order = kept
    width = 1 if parallel is None else max(1, parallel.width)
    for k, sc in enumerate(order):
        needed = [d for d in sc.deployments() if d not in cache]
        if needed:  # this one's and (with `parallel`) the next ones' not yet simulated
            later = [d for s in order[k + 1 :] for d in s.deployments() if d not in cache]
            _simulate(list(dict.fromkeys([*needed, *later]))[: max(width, len(needed))], run, cache, parallel)
        res = judge.judged(sc, cache)
        out.append(res)
        if not res.passed:
            break
    return out


@dataclass(frozen=True)
class Minimality:
    pool: str
    instances: int  # the count tried (planned − 1)
    failed: ScenarioResult | None  # the scenario that fails with one fewer; None = all passed (not minimal)
    note: str


@dataclass(frozen=True)
class FitResult:
    plan: CapacityPlan  # the final counts
    results: tuple[ScenarioResult, ...]  # the final plan's scenarios (all pass when `ok`)
    ok: bool
    history: tuple[str, ...]  # what was tried, in order
    minimality: tuple[Minimality, ...]
    limit_usd_per_hour: float = math.inf  # the cost limit the growth stopped at (when not `ok`)

    @property
    def failed(self) -> ScenarioResult | None:
        """The first failing scenario of the final plan (None when every scenario passes)."""
        return next((r for r in self.results if not r.passed), None)


PROGRESS_STEP = 0.01  # attainments closer than this are a tie between two growths


def _evaluate(
    chosen: Sequence[Scenario],
    run: RunDeployment,
    judge: Judge,
    cache: dict[tuple, EvalResult],
    parallel: Parallel | None,
) -> list[ScenarioResult]:
    """Each scenario judged, each distinct deployment simulated once (`cache`), `parallel` when given."""
    _simulate([d for sc in chosen for d in sc.deployments()], run, cache, parallel)
    return [judge.judged(sc, cache) for sc in chosen]


def _survivor_step(plan: CapacityPlan, pool: str, scenario: Scenario) -> int:
    """The fewest instances to add to `pool` so that `scenario`, when it takes instances from that pool, leaves one
    more serving (a node loss takes a whole node's share: 3 instances spread 2 + 1 lose 2, like 2)."""
    if scenario.reduced != pool:
        return 1
    q = plan.pool(pool)
    lost = (lambda p: p.node_loss) if scenario.name.startswith("node loss") else (lambda p: p.upgrading)
    serving = q.instances - lost(q)
    for d in range(1, q.instances + 2):
        bigger = q.with_instances(q.instances + d)
        if bigger.instances - lost(bigger) > serving:
            return d
    return 1


def _with(plan: CapacityPlan, pool: str, delta: int) -> CapacityPlan:
    return plan.with_counts({pool: plan.pool(pool).instances + delta})


def _growth_options(
    plan: CapacityPlan,
    bad: ScenarioResult,
    steps: Mapping[str, int],
    last: str,
    judge: Judge,
    max_usd_per_hour: float,
) -> list[tuple[Scenario, str, int, CapacityPlan]]:
    """Each pool's growth within the limit, the pool `bad` points at first: (the failing scenario after growing this
    pool, pool, step, grown plan). The step doubles while the same pool keeps growing (`last`, `steps`), and is at least
    what the scenario's lost instances take back (`_survivor_step`)."""
    options = []
    for pool in dict.fromkeys([bad.blame, *(q.name for q in plan.pools)]):
        step = max(2 * steps[pool] if pool == last else 1, _survivor_step(plan, pool, bad.scenario))
        while step > 1 and _with(plan, pool, step).usd_per_hour > max_usd_per_hour:
            step -= 1
        grown = _with(plan, pool, step)
        if grown.usd_per_hour <= max_usd_per_hour:
            scenario = next(
                sc for sc in scenarios(grown, judge.availability is not None) if sc.name == bad.scenario.name
            )
            options.append((scenario, pool, step, grown))
    return options


def fit(
    plan: CapacityPlan,
    run: RunDeployment,
    judge: Judge,
    max_usd_per_hour: float = math.inf,
    parallel: Parallel | None = None,
    known_failing: Mapping[str, int] | None = None,
) -> FitResult:
    """Grow the plan until every scenario passes (doubling steps per pool, no plan above `max_usd_per_hour`),
    then settle each pool's count at its minimum (module docstring). Not `ok` when growth reached the limit or
    the minimal passing plan still costs more than it. `known_failing`: counts per pool known to fail, where the
    bisection may start."""
    cache: dict[tuple, EvalResult] = {}
    history: list[str] = []
    # pool -> the highest count seen failing (with the other pools at or below their final counts); `known_failing`
    # seeds it (e.g. counts that failed with faster step times), to skip ahead only: minimality is still run
    failing: dict[str, int] = dict(known_failing or {})
    steps: dict[str, int] = {}
    last = ""
    results = check(plan, run, judge, cache, parallel, complete=False)
    while not all(r.passed for r in results):
        bad = next(r for r in results if not r.passed)
        options = _growth_options(plan, bad, steps, last, judge, max_usd_per_hour)
        if not options:
            history.append(
                f"{_counts_txt(plan.counts())}: {bad.describe()}; one more instance of any pool would cost more than "
                f"the limit ${max_usd_per_hour:,.2f}/h: stopped"
            )
            return FitResult(plan, tuple(results), False, tuple(history), (), max_usd_per_hour)
        outcomes = _evaluate([sc for sc, *_ in options], run, judge, cache, parallel)
        # the growth that moves the failing scenario furthest (by PROGRESS_STEP; ties: the pool it points at)
        k = max(
            range(len(options)),
            key=lambda i: (outcomes[i].passed, math.floor(outcomes[i].attainment / PROGRESS_STEP), -i),
        )
        _, pool, step, grown = options[k]
        failing[pool] = max(failing.get(pool, 0), plan.pool(pool).instances)
        compared = (
            ""
            if len(options) == 1
            else " ("
            + "; ".join(f"+{o[2]} {o[1]}: {r.attainment:.4f}" for o, r in zip(options, outcomes, strict=True))
            + ")"
        )
        history.append(f"{_counts_txt(plan.counts())}: {bad.describe()} → +{step} {pool}{compared}")
        plan, last, steps[pool] = grown, pool, step
        results = check(plan, run, judge, cache, parallel, complete=False)
    history.append(f"{_counts_txt(plan.counts())}: every scenario passes")
    minimal: dict[str, Minimality] = {}
    settled_at: dict[str, dict[str, int]] = {}  # pool -> the counts when it was last settled
    while any(settled_at.get(pool) != plan.counts() for pool in plan.counts()):  # P/D: until neither moves
        for pool in [p.name for p in plan.pools]:
            if settled_at.get(pool) != plan.counts():
                plan, minimal[pool] = _settle(plan, pool, failing.get(pool, 0), run, judge, cache, parallel, history)
                failing[pool] = plan.pool(pool).instances - 1
                settled_at[pool] = plan.counts()
    final = tuple(check(plan, run, judge, cache, parallel))
    if plan.usd_per_hour > max_usd_per_hour:  # it started above the limit and could not shrink below it
        history.append(
            f"{_counts_txt(plan.counts())}: passes every scenario only at ${plan.usd_per_hour:,.2f}/h, over the limit ${max_usd_per_hour:,.2f}/h"
        )
        return FitResult(plan, final, False, tuple(history), tuple(minimal.values()), max_usd_per_hour)
    return FitResult(plan, final, True, tuple(history), tuple(minimal.values()))


def _settle(
    plan: CapacityPlan,
    pool: str,
    failing: int,
    run: RunDeployment,
    judge: Judge,
    cache: dict[tuple, EvalResult],
    parallel: Parallel | None,
    history: list[str],
) -> tuple[CapacityPlan, Minimality]:
    """`plan` (every scenario passing) with `pool` at the fewest instances that still pass, and the one-fewer
    evidence: bisected between `failing` (a count seen failing; else found by trying one fewer, then halving: a
    plan far above its need, e.g. from a pessimistic excerpt, is not simulated at its size count by count) and the
    current count, then stepped down one at a time while one fewer passes at the other pools' current counts."""

    def passes(candidate: CapacityPlan) -> tuple[bool, list[ScenarioResult]]:
        tried = check(candidate, run, judge, cache, parallel, complete=False)
        return all(r.passed for r in tried), tried

    def shrink_to(n: int) -> bool:  # `pool` at n passes every scenario: keep it
        nonlocal plan
        ok, _ = passes(plan.with_counts({pool: n}))
        if ok:
            plan = plan.with_counts({pool: n})
            history.append(f"{_counts_txt(plan.counts())}: every scenario still passes → {pool} {n}")
        return ok

    hi = plan.pool(pool).instances
    lo = failing if 0 < failing < hi else None
    if (
        lo is None
    ):  # no failing count known: one fewer (the evidence a minimal count needs anyway), then halve until one fails
        nxt = hi - 1
        while lo is None:
            if nxt < 1:
                lo = 0
            elif shrink_to(nxt):
                hi, nxt = nxt, nxt // 2
            else:
                lo = nxt
    while hi - lo > 1:  # then bisect; the one-fewer runs below are the evidence
        mid = (lo + hi) // 2
        if shrink_to(mid):
            hi = mid
        else:
            lo = mid
    while True:
        n = plan.pool(pool).instances
        if n <= 1:
            return plan, Minimality(pool, n - 1, None, f"{pool}: 1 instance, cannot go lower")
        fewer = _with(plan, pool, -1)
        ok, tried = passes(fewer)
        if not ok:
            failed = next(r for r in tried if not r.passed)
            return plan, Minimality(pool, n - 1, failed, f"{pool} at {n - 1}: {failed.describe()}")
        history.append(f"{_counts_txt(fewer.counts())}: every scenario still passes → {pool} −1")
        plan = fewer
