"""The max-feasible-rate search on deterministic synthetic evaluate functions."""

from __future__ import annotations

import pytest
from synthetic import Dips, Knee, Overloaded

from llmcap.errors import LlmcapError
from llmcap.sizing.params import SearchParams
from llmcap.sizing.search import (
    EvalResult,
    confirm_max_rate,
    search_max_rate,
)

TOL = 0.02


def test_known_threshold_is_found_within_tolerance():
    p = SearchParams(seeds=(0,), rel_tol=TOL)
    r = search_max_rate(Knee(13.0), 0.99, p, initial_rate=3.0)
    # feasible iff A = 1 − (λ − 13)/13 ≥ 0.99 ⇔ λ ≤ 13 × 1.01 = 13.13
    edge = 13.0 * 1.01
    assert r.status == "converged"
    assert edge * (1 - TOL) <= r.max_rate <= edge
    assert r.upper_rate is not None and edge < r.upper_rate <= r.max_rate * (1 + TOL)
    assert r.violations == ()
    # bracket from 3: 3 → 6 → 12 → 24 (fails), then bisection; guard points below the answer all pass
    assert [pt.rate for pt in r.points[:4]] == [3.0, 6.0, 12.0, 24.0]
    assert [pt.phase for pt in r.points[:4]] == ["initial", "expand", "expand", "expand"]
    guards = [pt for pt in r.points if pt.phase == "guard"]
    assert [g.rate for g in guards] == pytest.approx([r.max_rate * 0.75, r.max_rate * 0.5])
    assert r.best is not None and r.best.feasible


def test_shrinks_from_a_high_guess():
    r = search_max_rate(Knee(5.0), 0.99, SearchParams(seeds=(0,)), initial_rate=100.0)
    assert [pt.rate for pt in r.points[:4]] == [100.0, 50.0, 25.0, 12.5]
    assert [pt.phase for pt in r.points[1:4]] == ["shrink"] * 3
    assert 5.05 * (1 - TOL) <= r.max_rate <= 5.05


def test_every_seed_must_pass_by_default_mean_is_optional():
    ev = Knee(10.0, jitter=0.1)  # seed thresholds 9, 10, 11
    strict = search_max_rate(ev, 0.99, SearchParams(seeds=(0, 1, 2)), initial_rate=1.0)
    # all seeds: bounded by the weakest seed: λ ≤ 9 × 1.01 = 9.09
    assert 9.09 * (1 - TOL) <= strict.max_rate <= 9.09
    assert all(len(pt.results) == 3 for pt in strict.points)
    mean = search_max_rate(ev, 0.99, SearchParams(seeds=(0, 1, 2), feasibility="mean"), initial_rate=1.0)
    assert mean.max_rate > strict.max_rate
    assert mean.best is not None and mean.best.mean_attainment >= 0.99
    assert min(mean.best.attainments) < 0.99  # the weakest seed misses at the mean rule's answer
    upper = [pt for pt in mean.points if pt.rate == mean.upper_rate][0]
    assert upper.mean_attainment < 0.99


def test_non_monotone_attainment_is_recorded_and_the_answer_is_conservative():
    ev = Dips(top=40.0, dips=((28.0, 32.0),))
    r = search_max_rate(ev, 0.99, SearchParams(seeds=(0,)), initial_rate=16.0)
    # 16 passes, 32 (in the dip) fails → bisection converges just under 28. The passing region 32 < λ ≤ 40 above the
    # first failure is never visited: the search is conservative by construction (it only looks below failures).
    assert r.status == "converged"
    assert 28.0 * (1 - TOL) <= r.max_rate <= 28.0
    assert r.violations == ()
    assert [pt.rate for pt in r.points[:2]] == [16.0, 32.0]


def test_guard_catches_a_dip_below_a_bisection_answer():
    # 16 passes, 32 passes, 64 fails → bisection converges at ~40; the guard at 40 × 0.75 = 30 falls in the dip
    ev = Dips(top=40.0, dips=((29.0, 31.0),))
    r = search_max_rate(ev, 0.99, SearchParams(seeds=(0,)), initial_rate=16.0)
    assert r.violations, "the failure at ~30 below passes at ~32..40 must be recorded"
    assert all(v.failed_rate < v.passed_rate for v in r.violations)
    failed = min(v.failed_rate for v in r.violations)
    assert 29.0 < failed <= 31.0
    # conservative: only rates below the lowest failure count → the answer is just under 29
    assert 29.0 * (1 - TOL) <= r.max_rate <= 29.0
    assert r.upper_rate is not None and r.upper_rate <= failed


def test_an_overloaded_run_is_infeasible_whatever_its_attainment():
    r = search_max_rate(Overloaded(12.0), 0.99, SearchParams(seeds=(0, 1), rel_tol=TOL), initial_rate=3.0)
    assert 12.0 * (1 - TOL) <= r.max_rate <= 12.0
    over = [pt for pt in r.points if pt.rate > 12.0]
    assert over and all(not pt.feasible and pt.mean_attainment == 1.0 for pt in over)
    mean = search_max_rate(Overloaded(12.0), 0.99, SearchParams(seeds=(0, 1), feasibility="mean"), initial_rate=3.0)
    assert mean.max_rate <= 12.0  # not averaged away under the mean rule either


def test_confirmation_steps_down_to_a_rate_that_holds():
    # the excerpts say 40 (A ≥ 0.99 up to 40.4), the whole trace holds only up to 25.25
    p = SearchParams(seeds=(0,), rel_tol=TOL)
    r = search_max_rate(Knee(40.0), 0.99, p, initial_rate=10.0, confirm=Knee(25.0))
    c = r.confirmation
    assert c is not None and c.status == "stepped_down"
    assert 40.4 * (1 - TOL) <= c.search_rate <= 40.4
    assert 25.25 * (1 - TOL) <= r.max_rate <= 25.25
    assert r.upper_rate is not None and 25.25 < r.upper_rate <= r.max_rate * (1 + TOL)
    # first the searched rate, then × (1 − confirm_step) steps until one holds, then bisection
    rates = [pt.rate for pt in c.points]
    assert rates[0] == c.search_rate and rates[1] == pytest.approx(c.search_rate * (1 - p.confirm_step))
    assert all(pt.phase == "confirm" for pt in c.points) and not c.points[0].feasible
    assert r.best is not None and r.best in c.points and r.best.rate == r.max_rate
    assert "stepped down" in c.describe() and "fails" in c.describe()
    # the excerpt search's own points are untouched (the attainment curve is theirs)
    assert r.points == search_max_rate(Knee(40.0), 0.99, p, initial_rate=10.0).points


def test_confirmation_keeps_a_rate_that_holds_and_reports_none_that_does():
    p = SearchParams(seeds=(0,))
    searched = search_max_rate(Knee(20.0), 0.99, p, initial_rate=5.0)
    kept = confirm_max_rate(Knee(30.0), searched, p)
    assert kept.confirmation is not None and kept.confirmation.status == "confirmed"
    assert kept.max_rate == searched.max_rate and len(kept.confirmation.points) == 1
    assert kept.best is kept.confirmation.points[0]
    never = confirm_max_rate(lambda rate, seed: EvalResult(0.0), searched, p.model_copy(update={"min_rate": 10.0}))
    assert never.confirmation is not None and never.confirmation.status == "none_held"
    assert (never.max_rate, never.status, never.best) == (0.0, "infeasible", None)
    assert [pt.rate for pt in never.confirmation.points] == pytest.approx(
        [20.0, 16.0, 12.8, 10.24]
    )  # next: 8.19 < min_rate
    capped = confirm_max_rate(Knee(1.0), searched, p.model_copy(update={"max_confirmations": 2}))
    assert capped.confirmation is not None and capped.confirmation.status == "max_evaluations"
    assert capped.max_rate == 0.0 and len(capped.confirmation.points) == 2
    assert confirm_max_rate(Knee(1.0), never, p) is never  # nothing to confirm


def test_deterministic():
    ev = Knee(7.3, jitter=0.05)
    a = search_max_rate(ev, 0.99, SearchParams(), initial_rate=2.0)
    b = search_max_rate(ev, 0.99, SearchParams(), initial_rate=2.0)
    assert a == b


def test_infeasible_everywhere_and_pinned_at_max_rate():
    never = search_max_rate(
        lambda rate, seed: EvalResult(0.5), 0.99, SearchParams(seeds=(0,), min_rate=0.1), initial_rate=1.0
    )
    assert (never.status, never.max_rate) == ("infeasible", 0.0)
    assert min(pt.rate for pt in never.points) == 0.1  # the floor itself was tried
    always = search_max_rate(
        lambda rate, seed: EvalResult(1.0), 0.99, SearchParams(seeds=(0,), max_rate=50.0), initial_rate=3.0
    )
    assert (always.status, always.max_rate, always.upper_rate) == ("at_max_rate", 50.0, None)
    capped = search_max_rate(Knee(1000.0), 0.99, SearchParams(seeds=(0,), max_evaluations=3), initial_rate=1.0)
    assert capped.status == "max_evaluations" and len(capped.points) == 3 and capped.max_rate == 4.0
    with pytest.raises(LlmcapError):
        search_max_rate(Knee(1.0), 0.99, SearchParams(min_rate=5.0, max_rate=1.0))


def test_calls_every_seed_at_every_rate():
    calls: list[tuple[float, int]] = []

    def ev(rate: float, seed: int) -> EvalResult:
        calls.append((rate, seed))
        return Knee(4.0)(rate, seed)

    r = search_max_rate(ev, 0.99, SearchParams(seeds=(7, 8)), initial_rate=1.0)
    assert calls == [(pt.rate, s) for pt in r.points for s in (7, 8)]


SEED_THRESHOLD = {0: 10.0, 1: 8.0, 2: 9.3}


def _seeded_step(rate: float, seed: int) -> EvalResult:
    return EvalResult(1.0 if rate <= SEED_THRESHOLD[seed] else 0.5)


def test_a_search_that_fails_at_its_floor_stops_there():
    params = SearchParams(seeds=(0, 1, 2), rel_tol=0.02, guard_points=0)
    cut = search_max_rate(_seeded_step, 0.99, params, initial_rate=1.0, floor_rate=8.5)  # seed 1 holds only 8
    assert cut.status == "below_floor" and cut.max_rate == 0.0 and cut.upper_rate == 8.5 and len(cut.points) == 1
    full = search_max_rate(_seeded_step, 0.99, params, initial_rate=1.0, floor_rate=7.0)
    assert full.points[0].phase == "floor" and full.points[0].feasible and full.status == "converged"
    assert 7.0 <= full.max_rate <= SEED_THRESHOLD[1] < full.max_rate * (1 + params.rel_tol)
