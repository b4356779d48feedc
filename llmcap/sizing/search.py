"""Max feasible arrival rate of one candidate, given a plain `evaluate(rate, seed) -> EvalResult` callable.

The callable is whatever measures attainment at a rate: the simulator on the rate-scaled trace (at
integration), a live open-loop replay, or a synthetic function in tests. This module only decides
*which* rates to try and what the answer is.

Algorithm (deterministic: the same evaluate gives the same sequence of rates and the same answer):
1. Evaluate the initial rate (the caller's analytic guess, clipped to [min_rate, max_rate]).
2. Bracket: from the bracket (lo = highest feasible rate below every infeasible one, hi = lowest
   infeasible rate) expand ×2 while nothing is infeasible, shrink ÷2 while nothing is feasible.
3. Bisect at (lo + hi) / 2 until hi − lo ≤ rel_tol × lo.
4. Monotonicity guard: evaluate `guard_points` rates below the answer (answer × (1 − i·guard_step)).
   Any infeasible rate below a feasible one is recorded as a `Violation`; the bracket is recomputed
   from all points, which is the conservative answer (only rates below the lowest failure count), and
   the search continues there. It ends when a converged answer's guard points all pass.
A rate is feasible when **every seed** meets the attainment target (`feasibility="all_seeds"`, the
default: a capacity promise should hold on each independent draw of the arrivals, not on average), or
when the mean over seeds does (`"mean"`). Under either rule a run the evaluate reports as overloaded
(`EvalResult.overload`), or missing a run-level target (`EvalResult.run_miss`: token-level ITL), makes the
rate infeasible whatever its attainment.

Confirmation (`confirm_max_rate`, when the caller passes a second evaluate, e.g. the whole trace): the
answer is evaluated there; if it fails, rates step down × (1 − confirm_step) until one holds, then bisect
between the highest that held and the lowest that failed to `rel_tol`. The answer becomes the highest rate
that held (0 when none did within `max_confirmations`), and `SearchResult.confirmation` says what happened.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Literal

from llmcap.errors import LlmcapError
from llmcap.sizing.params import SearchParams

if TYPE_CHECKING:
    from llmcap.sizing.executor import Executor


@dataclass(frozen=True)
class EvalResult:
    """What one (rate, seed) evaluation reports: attainment, plus any summary metrics (ttft_p99_ms, ...)."""

    attainment: float
    metrics: Mapping[str, float] = field(default_factory=dict)
    overload: str = ""  # why the run was overloaded (a still-growing queue, ...); "" when it was stable
    run_miss: str = ""  # a target judged on the whole run that it missed (token-level ITL, ...); "" when none

    @property
    def stable(self) -> bool:
        return not self.overload

    @property
    def run_ok(self) -> bool:
        """Stable and no run-level target missed: only then does attainment decide."""
        return self.stable and not self.run_miss


Evaluate = Callable[[float, int], EvalResult]
Status = Literal["converged", "at_max_rate", "infeasible", "max_evaluations", "below_floor"]
ConfirmStatus = Literal["confirmed", "stepped_down", "none_held", "max_evaluations"]


@dataclass(frozen=True)
class RatePoint:
    rate: float
    feasible: bool
    seeds: tuple[int, ...]
    results: tuple[EvalResult, ...]
    phase: str  # "initial" | "expand" | "shrink" | "bisect" | "guard"

    @property
    def attainments(self) -> tuple[float, ...]:
        return tuple(r.attainment for r in self.results)

    @property
    def mean_attainment(self) -> float:
        return sum(self.attainments) / len(self.results)


@dataclass(frozen=True)
class Violation:
    """A rate that failed below a rate that passed: attainment is not monotone in λ here."""

    failed_rate: float
    passed_rate: float


@dataclass(frozen=True)
class Confirmation:
    """The search's answer checked on a second evaluate (the whole trace): what held, what did not."""

    search_rate: float  # the search's own answer, before confirmation
    status: ConfirmStatus
    points: tuple[RatePoint, ...]  # in evaluation order, phase "confirm"

    def describe(self) -> str:
        tried = ", ".join(f"{p.rate:.4g} {'holds' if p.feasible else 'fails'}" for p in self.points)
        overloads = sorted({r.overload for p in self.points for r in p.results if r.overload})
        why = f" (overloaded: {overloads[0]})" if overloads else ""
        return f"{self.status.replace('_', ' ')}: searched {self.search_rate:.4g} req/s; {tried}{why}"


@dataclass(frozen=True)
class SearchResult:
    max_rate: (
        float  # the highest feasible (and, when confirmed, confirmed) rate below every infeasible one; 0 when none
    )
    upper_rate: float | None  # the lowest infeasible rate seen (None: none seen)
    status: Status
    points: tuple[RatePoint, ...]  # the search's evaluations, in order (confirmation's: `confirmation.points`)
    violations: tuple[Violation, ...]
    attainment_target: float
    confirmation: Confirmation | None = None

    @property
    def best(self) -> RatePoint | None:
        """The evaluation at the answer: the confirming one when there is one."""
        confirmed = () if self.confirmation is None else self.confirmation.points
        return next((p for p in (*confirmed, *self.points) if p.rate == self.max_rate and p.feasible), None)

    def curve(self) -> list[tuple[float, float]]:
        """(rate, mean attainment) sorted by rate — the attainment-vs-λ curve; the knee is `max_rate`."""
        return sorted((p.rate, p.mean_attainment) for p in self.points)


def _feasible(results: Sequence[EvalResult], target: float, rule: str) -> bool:
    if not all(r.run_ok for r in results):  # an overloaded run (or a run-level miss) is never averaged away
        return False
    att = [r.attainment for r in results]
    return min(att) >= target if rule == "all_seeds" else sum(att) / len(att) >= target


def _run_seed(evaluate: Evaluate, rate: float, seed: int) -> EvalResult:
    return evaluate(rate, seed)


def evaluate_at(task: tuple[Evaluate, float, int]) -> EvalResult:
    """(evaluate, rate, seed) → evaluate(rate, seed): one picklable task for an executor."""
    evaluate, rate, seed = task
    return evaluate(rate, seed)


def _bracket(points: Mapping[float, RatePoint]) -> tuple[float | None, float | None]:
    """(lo, hi): the lowest infeasible rate, and the highest feasible rate below it (conservative)."""
    bad = [r for r, p in points.items() if not p.feasible]
    hi = min(bad) if bad else None
    good = [r for r, p in points.items() if p.feasible and (hi is None or r < hi)]
    return (max(good) if good else None), hi


def _violations(points: Mapping[float, RatePoint]) -> tuple[Violation, ...]:
    bad = sorted(r for r, p in points.items() if not p.feasible)
    good = sorted(r for r, p in points.items() if p.feasible)
    return tuple(Violation(f, g) for f in bad for g in good if g > f)


def search_max_rate(
    evaluate: Evaluate,
    attainment_target: float,
    params: SearchParams | None = None,
    initial_rate: float | None = None,
    executor: Executor | None = None,
    confirm: Evaluate | None = None,
    floor_rate: float | None = None,
) -> SearchResult:
    """The max feasible rate of one candidate (module docstring). Seeds of one rate go through `executor`;
    with `confirm`, the answer is then confirmed on it (`confirm_max_rate`). With `floor_rate` (branch and
    bound: the rate a candidate needs to beat the best found), that rate is evaluated first and a failure
    there ends the search: status "below_floor", max rate 0, upper rate the floor."""
    p = params or SearchParams()
    if p.min_rate > p.max_rate:
        raise LlmcapError(f"search min_rate {p.min_rate:g} > max_rate {p.max_rate:g}")
    points: dict[float, RatePoint] = {}
    order: list[float] = []

    def run(rate: float, phase: str) -> None:
        points[rate] = _evaluate_rate(evaluate, rate, attainment_target, p, phase, executor)
        order.append(rate)

    if floor_rate is not None and floor_rate > 0:
        run(floor_rate, "floor")
        if not points[floor_rate].feasible:
            return SearchResult(0.0, floor_rate, "below_floor", (points[floor_rate],), (), attainment_target)

    start = min(max(p.initial_rate or initial_rate or 1.0, p.min_rate), p.max_rate)
    if start not in points:
        run(start, "initial")
    guarded: set[float] = set()  # answers whose guard points were evaluated
    status: Status = "max_evaluations"
    while len(order) < p.max_evaluations:
        lo, hi = _bracket(points)
        if lo is None:
            assert hi is not None
            nxt = hi / 2
            if nxt < p.min_rate:
                if p.min_rate < hi and p.min_rate not in points:
                    run(p.min_rate, "shrink")  # the floor itself decides
                    continue
                status = "infeasible"
                break
            run(nxt, "shrink")
            continue
        if hi is None and lo < p.max_rate:
            run(min(lo * 2, p.max_rate), "expand")
            continue
        if hi is not None and hi - lo > p.rel_tol * lo:
            run((lo + hi) / 2, "bisect")
            continue
        # Converged (or pinned at max_rate): the monotonicity guard below the answer.
        if lo not in guarded:
            guarded.add(lo)
            todo = [g for i in range(1, p.guard_points + 1) if (g := lo * (1 - i * p.guard_step)) >= p.min_rate]
            todo = [g for g in todo if g not in points][: p.max_evaluations - len(order)]
            for g in todo:
                run(g, "guard")
            if todo:
                continue
        status = "at_max_rate" if hi is None else "converged"
        break
    lo, hi = _bracket(points)
    result = SearchResult(
        max_rate=0.0 if lo is None else lo,
        upper_rate=hi,
        status=status,
        points=tuple(points[r] for r in order),
        violations=_violations(points),
        attainment_target=attainment_target,
    )
    return result if confirm is None else confirm_max_rate(confirm, result, p, executor)


def _evaluate_rate(
    evaluate: Evaluate, rate: float, target: float, p: SearchParams, phase: str, executor: Executor | None
) -> RatePoint:
    fn = partial(_run_seed, evaluate, rate)
    results = tuple(executor.map(fn, list(p.seeds)) if executor is not None else [fn(s) for s in p.seeds])
    return RatePoint(rate, _feasible(results, target, p.feasibility), p.seeds, results, phase)


def confirm_max_rate(
    confirm: Evaluate, result: SearchResult, params: SearchParams | None = None, executor: Executor | None = None
) -> SearchResult:
    """`result` with its answer confirmed on `confirm` (module docstring): the highest rate that held there,
    never above the search's. A search without an answer (max rate 0) is returned as it is."""
    p = params or SearchParams()
    if result.max_rate <= 0:
        return result
    held: float | None = None
    failed: float | None = None
    pts: list[RatePoint] = []
    rate = result.max_rate
    status: ConfirmStatus = "max_evaluations"
    while len(pts) < p.max_confirmations:
        pt = _evaluate_rate(confirm, rate, result.attainment_target, p, "confirm", executor)
        pts.append(pt)
        if pt.feasible:
            held = rate
        else:
            failed = rate
        if failed is None:
            status = "confirmed"
            break
        if held is None:
            rate = failed * (1 - p.confirm_step)
            if rate < p.min_rate:
                status = "none_held"
                break
            continue
        if failed - held <= p.rel_tol * held:
            status = "stepped_down"
            break
        rate = (held + failed) / 2
    confirmation = Confirmation(result.max_rate, status, tuple(pts))
    if held is None:
        return replace(result, max_rate=0.0, upper_rate=failed, status="infeasible", confirmation=confirmation)
    upper = result.upper_rate if failed is None else failed
    return replace(result, max_rate=held, upper_rate=upper, confirmation=confirmation)


# ---------------------------------------------------------------- many candidates, one executor


@dataclass(frozen=True)
class SearchTask:
    """One candidate's search, shippable to a worker (its evaluate must pickle for process/Dask workers)."""

    key: str
    evaluate: Evaluate
    attainment_target: float
    params: SearchParams = SearchParams()
    initial_rate: float | None = None
    confirm: Evaluate | None = None  # where the answer is confirmed (the whole trace); None = not confirmed
    floor_rate: float | None = None  # branch and bound: stop when this rate fails (`search_max_rate`)


def run_search_task(task: SearchTask) -> SearchResult:
    return search_max_rate(
        task.evaluate,
        task.attainment_target,
        task.params,
        task.initial_rate,
        confirm=task.confirm,
        floor_rate=task.floor_rate,
    )


def search_candidates(tasks: Sequence[SearchTask], executor: Executor | None = None) -> dict[str, SearchResult]:
    """Each task's search, spread over `executor` (one task per worker; seeds run inside the task). A lone task
    runs here with its seeds spread over the workers instead (the same result)."""
    keys = [t.key for t in tasks]
    if len(set(keys)) != len(keys):
        raise LlmcapError("search task keys must be unique")
    slots = getattr(executor, "slots", None)
    if executor is not None and len(tasks) == 1 and callable(slots) and slots() > 1:
        t = tasks[0]
        return {
            t.key: search_max_rate(
                t.evaluate, t.attainment_target, t.params, t.initial_rate, executor, t.confirm, t.floor_rate
            )
        }
    results = (
        executor.map(run_search_task, list(tasks)) if executor is not None else [run_search_task(t) for t in tasks]
    )
    return dict(zip(keys, results, strict=True))
