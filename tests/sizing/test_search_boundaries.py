"""The rate search's limits, each hit exactly (llmcap.sizing.search): attainment at the target, the
tolerance at which bisection stops, the guard points' floor and budget, the confirmation's step and
stop, the floor rate, the seeds going through an executor, and many candidates searched at once.
Rates are binary fractions (1, 1.5, 0.75, ...), so "exactly at the limit" is exact in floating point."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from llmcap.errors import LlmcapError
from llmcap.sizing.params import SearchParams
from llmcap.sizing.search import (
    Confirmation,
    EvalResult,
    RatePoint,
    SearchTask,
    confirm_max_rate,
    evaluate_at,
    run_search_task,
    search_candidates,
    search_max_rate,
)

ONE_SEED = dict(seeds=(0,), guard_points=0)


def holds_up_to(threshold: float, att_ok: float = 1.0, att_bad: float = 0.5) -> Callable[[float, int], EvalResult]:
    return lambda rate, seed: EvalResult(att_ok if rate <= threshold else att_bad)


class Recorder:
    """An executor that runs `map` in process and counts what went through it."""

    def __init__(self) -> None:
        self.items: list = []

    def map(self, fn: Callable, items: Iterable) -> list:
        items = list(items)
        self.items.extend(items)
        return [fn(i) for i in items]


def rates(result) -> list[float]:
    return [p.rate for p in result.points]


# ---- feasibility --------------------------------------------------------------------------------------------


def test_attainment_exactly_at_the_target_is_feasible_under_both_rules() -> None:
    # every seed at exactly 0.75 (all_seeds), and 0.5 / 1.0 averaging exactly 0.75 (mean): both hold at 1 req/s
    at_target = search_max_rate(
        holds_up_to(1.0, att_ok=0.75),
        0.75,
        SearchParams(seeds=(0, 1), guard_points=0, max_evaluations=2),
        initial_rate=1.0,
    )
    assert at_target.points[0].feasible and at_target.max_rate == 1.0
    split = lambda rate, seed: EvalResult((0.5, 1.0)[seed] if rate <= 1.0 else 0.0)  # noqa: E731
    mean = search_max_rate(
        split, 0.75, SearchParams(seeds=(0, 1), feasibility="mean", guard_points=0, max_evaluations=2), initial_rate=1.0
    )
    assert mean.points[0].feasible and mean.max_rate == 1.0
    strict = search_max_rate(
        split, 0.75, SearchParams(seeds=(0, 1), guard_points=0, max_evaluations=2), initial_rate=1.0
    )
    assert not strict.points[0].feasible  # all seeds: the 0.5 seed fails


# ---- bracket, bisection, guard ----------------------------------------------------------------------------


def test_bisection_stops_when_the_gap_equals_the_tolerance() -> None:
    # holds up to 1.2: 1 holds, 2 fails, 1.5 fails; 1.5 − 1 = 0.5 = rel_tol × 1: converged, 1.25 never tried
    r = search_max_rate(holds_up_to(1.2), 0.99, SearchParams(rel_tol=0.5, **ONE_SEED), initial_rate=1.0)
    assert rates(r) == [1.0, 2.0, 1.5] and [p.phase for p in r.points] == ["initial", "expand", "bisect"]
    assert (r.status, r.max_rate, r.upper_rate) == ("converged", 1.0, 1.5)


def test_without_a_guess_the_search_starts_at_1_req_s() -> None:
    r = search_max_rate(holds_up_to(10.0), 0.99, SearchParams(max_evaluations=1, **ONE_SEED))
    assert rates(r) == [1.0] and r.status == "max_evaluations"


def test_min_rate_equal_to_max_rate_is_allowed_and_above_it_is_named() -> None:
    r = search_max_rate(holds_up_to(10.0), 0.99, SearchParams(min_rate=5.0, max_rate=5.0, **ONE_SEED))
    assert rates(r) == [5.0] and (r.status, r.max_rate) == ("at_max_rate", 5.0)
    with pytest.raises(LlmcapError) as info:
        search_max_rate(holds_up_to(10.0), 0.99, SearchParams(min_rate=6.0, max_rate=5.0, **ONE_SEED))
    assert str(info.value) == "search min_rate 6 > max_rate 5"


def test_shrinking_below_min_rate_tries_min_rate_itself() -> None:
    # 4 fails, 2 fails, 1 fails; half of 1 is below min_rate 0.75: 0.75 itself is tried (and holds)
    r = search_max_rate(holds_up_to(0.8), 0.99, SearchParams(min_rate=0.75, rel_tol=0.5, **ONE_SEED), initial_rate=4.0)
    assert rates(r)[:4] == [4.0, 2.0, 1.0, 0.75] and [p.phase for p in r.points[:4]] == [
        "initial",
        "shrink",
        "shrink",
        "shrink",
    ]
    assert r.max_rate == 0.75 and r.status == "converged"  # 1 − 0.75 = 0.25 ≤ 0.5 × 0.75


def test_a_guard_point_exactly_at_min_rate_is_evaluated() -> None:
    # 1 holds, 2 fails (2 − 1 = 1 > 0.99 × 1: bisect), 1.5 fails (0.5 ≤ 0.99: converged at 1);
    # its guard at 1 × (1 − 0.5) = 0.5 = min_rate: evaluated
    p = SearchParams(seeds=(0,), guard_points=1, guard_step=0.5, min_rate=0.5, rel_tol=0.99)
    r = search_max_rate(holds_up_to(1.2), 0.99, p, initial_rate=1.0)
    assert rates(r) == [1.0, 2.0, 1.5, 0.5] and r.points[-1].phase == "guard"


def test_guard_points_stop_at_the_evaluation_budget() -> None:
    # 1, 2 (fails), 1.5 (fails): 3 of 4 evaluations spent; of the guards 0.75 and 0.5 only 0.75 fits the budget
    p = SearchParams(seeds=(0,), guard_points=2, guard_step=0.25, rel_tol=0.5, max_evaluations=4)
    r = search_max_rate(holds_up_to(1.2), 0.99, p, initial_rate=1.0)
    assert rates(r) == [1.0, 2.0, 1.5, 0.75] and r.status == "max_evaluations"


def test_the_curve_is_sorted_by_rate_with_mean_attainments() -> None:
    split = lambda rate, seed: EvalResult(1.0 if rate <= 1.2 else (0.5, 0.25)[seed])  # noqa: E731
    r = search_max_rate(split, 0.99, SearchParams(seeds=(0, 1), rel_tol=0.5, guard_points=0), initial_rate=1.0)
    assert r.curve() == [(1.0, 1.0), (1.5, 0.375), (2.0, 0.375)]


# ---- the floor rate (branch and bound) ----------------------------------------------------------------------


def test_a_floor_rate_that_fails_ends_the_search_below_floor() -> None:
    r = search_max_rate(holds_up_to(0.3), 0.9, SearchParams(**ONE_SEED), initial_rate=0.25, floor_rate=0.5)
    assert (r.max_rate, r.upper_rate, r.status, rates(r), r.violations, r.attainment_target) == (
        0.0,
        0.5,
        "below_floor",
        [0.5],
        (),
        0.9,
    )
    assert r.points[0].phase == "floor"


def test_a_floor_below_1_req_s_is_still_tried_and_a_floor_of_0_is_none() -> None:
    r = search_max_rate(
        holds_up_to(0.75), 0.99, SearchParams(max_evaluations=2, **ONE_SEED), initial_rate=0.25, floor_rate=0.5
    )
    assert rates(r) == [0.5, 0.25] and r.points[0].phase == "floor"
    r0 = search_max_rate(
        holds_up_to(0.75), 0.99, SearchParams(max_evaluations=1, **ONE_SEED), initial_rate=0.25, floor_rate=0.0
    )
    assert rates(r0) == [0.25] and r0.points[0].phase == "initial"


# ---- executor ---------------------------------------------------------------------------------------------------


def test_every_seed_goes_through_the_executor_when_there_is_one() -> None:
    ex = Recorder()
    seen: list[tuple[float, int]] = []

    def ev(rate: float, seed: int) -> EvalResult:
        seen.append((rate, seed))
        return EvalResult(1.0 if rate <= 1.2 else 0.5)

    confirm = lambda rate, seed: EvalResult(1.0)  # noqa: E731
    r = search_max_rate(
        ev,
        0.99,
        SearchParams(seeds=(3, 4), rel_tol=0.5, guard_points=0),
        initial_rate=1.0,
        executor=ex,
        confirm=confirm,
    )
    # search: 1, 2, 1.5 × seeds 3, 4; confirmation: 1 × seeds 3, 4 — 8 seed runs, every one through the executor
    assert ex.items == [3, 4] * 4 and seen == [(1.0, 3), (1.0, 4), (2.0, 3), (2.0, 4), (1.5, 3), (1.5, 4)]
    assert r.confirmation is not None and r.confirmation.status == "confirmed"


def test_evaluate_at_is_one_call() -> None:
    assert evaluate_at((lambda rate, seed: EvalResult(rate / 10 + seed), 2.0, 3)) == EvalResult(3.2)


def test_many_candidates_each_get_their_own_search_with_its_floor_and_confirmation() -> None:
    p = SearchParams(rel_tol=0.5, confirm_step=0.5, **ONE_SEED)
    tasks = [
        SearchTask("a", holds_up_to(1.2), 0.99, p, initial_rate=0.5),  # 0.5, 1 hold, 2 fails, 1.5 fails
        SearchTask("b", holds_up_to(1.2), 0.99, p, initial_rate=1.0, floor_rate=2.0),  # its floor fails: below_floor
        SearchTask(
            "c", holds_up_to(1.2), 0.99, p, initial_rate=1.0, confirm=holds_up_to(0.6)
        ),  # 1 fails there, 0.5 holds, 0.75 fails
    ]
    ex = Recorder()
    out = search_candidates(tasks, ex)
    assert list(out) == ["a", "b", "c"] and ex.items == tasks
    assert (out["a"].max_rate, out["a"].status, rates(out["a"])) == (1.0, "converged", [0.5, 1.0, 2.0, 1.5])
    assert (out["b"].max_rate, out["b"].status) == (0.0, "below_floor")
    assert out["c"].max_rate == 0.5 and out["c"].confirmation is not None
    assert search_candidates(tasks) == out  # without an executor: the same, in process
    assert run_search_task(tasks[2]) == out["c"]
    with pytest.raises(LlmcapError, match="^search task keys must be unique$"):
        search_candidates([tasks[0], tasks[0]])


# ---- confirmation -------------------------------------------------------------------------------------------------


def _searched(max_rate: float, upper: float | None = 4.0):
    point = RatePoint(max_rate, True, (0,), (EvalResult(1.0),), "bisect")
    from llmcap.sizing.search import SearchResult

    return SearchResult(max_rate, upper, "converged", (point,), (), 0.99)


def test_an_answer_below_1_req_s_is_still_confirmed() -> None:
    r = confirm_max_rate(holds_up_to(1.0), _searched(0.5), SearchParams(**ONE_SEED))
    assert r.confirmation is not None and r.confirmation.status == "confirmed"
    assert (r.max_rate, r.upper_rate) == (0.5, 4.0)  # confirmed as it was: the search's upper rate is kept


def test_confirmation_steps_down_to_min_rate_exactly() -> None:
    # 1 fails; 1 × (1 − 0.5) = 0.5 = min_rate: tried (not "below the floor"), and holds; 1 − 0.5 = 0.5 > 0.5 × 0.5,
    # so bisect: 0.75 fails, 0.75 − 0.5 = 0.25 ≤ 0.25: stepped down to 0.5
    p = SearchParams(min_rate=0.5, confirm_step=0.5, rel_tol=0.5, **ONE_SEED)
    r = confirm_max_rate(holds_up_to(0.5), _searched(1.0), p)
    assert [pt.rate for pt in r.confirmation.points] == [1.0, 0.5, 0.75]
    assert (r.max_rate, r.upper_rate, r.confirmation.status) == (0.5, 0.75, "stepped_down")


def test_confirmation_bisects_until_the_gap_equals_the_tolerance() -> None:
    # 2 fails, 1 holds (step 0.5), 1.5 fails: 1.5 − 1 = 0.5 = rel_tol 0.5 × 1: stepped down to 1, 1.25 never tried
    p = SearchParams(confirm_step=0.5, rel_tol=0.5, **ONE_SEED)
    r = confirm_max_rate(holds_up_to(1.2), _searched(2.0), p)
    assert [pt.rate for pt in r.confirmation.points] == [2.0, 1.0, 1.5]
    assert (r.max_rate, r.upper_rate, r.status, r.confirmation.status) == (1.0, 1.5, "converged", "stepped_down")


def test_nothing_held_keeps_the_last_failure_as_the_upper_rate() -> None:
    # 1 fails, 0.5 fails, 0.25 < min_rate 0.3: none held
    p = SearchParams(min_rate=0.3, confirm_step=0.5, **ONE_SEED)
    r = confirm_max_rate(holds_up_to(0.1), _searched(1.0), p)
    assert (r.max_rate, r.upper_rate, r.status, r.confirmation.status) == (0.0, 0.5, "infeasible", "none_held")


def test_the_search_passes_its_params_to_the_confirmation() -> None:
    # confirm_step 0.5 (default 0.2): after 1 fails the next rate is 0.5, not 0.8; then 0.75 (fails) ends it
    p = SearchParams(confirm_step=0.5, rel_tol=0.5, **ONE_SEED)
    r = search_max_rate(holds_up_to(1.2), 0.99, p, initial_rate=1.0, confirm=holds_up_to(0.6))
    assert [pt.rate for pt in r.confirmation.points] == [1.0, 0.5, 0.75]


def test_a_confirmation_says_what_held_and_why_a_run_failed() -> None:
    pts = (
        RatePoint(2.0, False, (0,), (EvalResult(0.4, overload="queue still growing"),), "confirm"),
        RatePoint(1.0, True, (0,), (EvalResult(1.0),), "confirm"),
        RatePoint(1.5, False, (0,), (EvalResult(0.9, overload="queue still growing"),), "confirm"),
    )
    text = Confirmation(2.0, "stepped_down", pts).describe()
    assert text == "stepped down: searched 2 req/s; 2 fails, 1 holds, 1.5 fails (overloaded: queue still growing)"
    assert Confirmation(1.0, "confirmed", pts[1:2]).describe() == "confirmed: searched 1 req/s; 1 holds"


class Slotted(Recorder):
    """A Recorder that says how many workers it has, as LocalExecutor and DaskExecutor do."""

    def __init__(self, workers: int) -> None:
        super().__init__()
        self.workers = workers

    def slots(self) -> int:
        return self.workers


def _lone_task() -> SearchTask:
    # floor 0.25 holds, then 0.5, 1 hold, 2 and 1.5 fail (converged at 1: 1.5 - 1 <= 0.5 × 1); confirmed on a
    # system that holds up to 0.6: 1 fails, 0.5 holds, 0.75 fails, so the answer is 0.5
    p = SearchParams(rel_tol=0.5, confirm_step=0.5, seeds=(0, 1), guard_points=0)
    return SearchTask("solo", holds_up_to(1.2), 0.99, p, initial_rate=0.5, confirm=holds_up_to(0.6), floor_rate=0.25)


def test_a_lone_task_spreads_its_seeds_over_the_workers_with_the_same_result() -> None:
    task = _lone_task()
    alone = run_search_task(task)
    assert (alone.max_rate, rates(alone)) == (0.5, [0.25, 0.5, 1.0, 2.0, 1.5])
    assert alone.confirmation is not None and alone.points[0].phase == "floor"
    ex = Slotted(2)
    out = search_candidates([task], ex)
    assert out == {"solo": alone}
    # 5 searched rates + 3 confirmation rates, each with seeds 0 and 1, one map per rate: seeds, not tasks
    assert ex.items == [0, 1] * 8


def test_one_worker_or_several_tasks_go_through_the_executor_a_task_at_a_time() -> None:
    task = _lone_task()
    one = Slotted(1)
    assert search_candidates([task], one) == {"solo": run_search_task(task)} and one.items == [task]
    other = SearchTask("other", holds_up_to(2.4), 0.99, task.params, initial_rate=1.0)
    two = Slotted(2)
    out = search_candidates([task, other], two)
    assert two.items == [task, other] and out == {"solo": run_search_task(task), "other": run_search_task(other)}
    unslotted = Recorder()  # an executor that cannot say its size is given whole tasks
    assert search_candidates([task], unslotted) == {"solo": out["solo"]} and unslotted.items == [task]
