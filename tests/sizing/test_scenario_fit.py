"""The scenario fit on hand-made deployments whose true need is known: it grows a plan far below its need in
doubling steps, shrinks one far above it to the known minimum, stops at its cost limit, and settles coupled
P/D pools. Each run is a step function of the serving counts, so the minimum is known exactly."""

from __future__ import annotations

from collections.abc import Mapping

from llmcap.sizing.headroom import PoolInput, plan_headroom
from llmcap.sizing.params import HeadroomParams
from llmcap.sizing.scenarios import Judge, fit
from llmcap.sizing.search import EvalResult

NO_OUTAGES = HeadroomParams(node_failures=0, max_surge=0, max_unavailable=0)  # one scenario: every instance serving
RATE = 5.0
NEED = 13  # serving instances the "trace" needs
JUDGE = Judge(0.99, 0.9, "instances", None)


class Counted:
    """A deployment whose attainment is 1.0 with at least NEED instances serving, else 0.5; counts its simulations."""

    def __init__(self) -> None:
        self.runs: list[int] = []

    def __call__(self, counts: Mapping[str, int]) -> EvalResult:
        self.runs.append(counts["instances"])
        return EvalResult(1.0 if counts["instances"] >= NEED else 0.5)


def _plan(g: float, params: HeadroomParams = NO_OUTAGES):
    return plan_headroom(RATE, [PoolInput("instances", g, 1, 8, 2.0)], params)


def test_a_plan_far_below_its_need_grows_in_doubling_steps_then_settles_at_the_need():
    run = Counted()
    plan0 = _plan(g=5.0)  # the excerpt said one instance carries the whole rate: 1 instance
    assert plan0.pool("instances").instances == 1
    fitted = fit(plan0, run, JUDGE)
    assert fitted.ok and fitted.plan.pool("instances").instances == NEED
    # growth 1 → 2 → 4 → 8 → 16 (steps +1, +2, +4, +8), then bisection between 8 (failed) and 16: 12 fails, 14 and 13 pass
    assert run.runs[:5] == [1, 2, 4, 8, 16]
    assert sorted(set(run.runs)) == [1, 2, 4, 8, 12, 13, 14, 16]
    assert len(run.runs) == len(set(run.runs))  # each deployment simulated once
    (evidence,) = fitted.minimality
    assert evidence.instances == NEED - 1 and evidence.failed is not None and not evidence.failed.passed


def test_a_plan_far_above_its_need_shrinks_to_the_known_minimum():
    run = Counted()
    plan0 = _plan(g=RATE / 40)  # an excerpt far too pessimistic: 40 instances
    assert plan0.pool("instances").instances == 40
    fitted = fit(plan0, run, JUDGE)
    assert fitted.ok and fitted.plan.pool("instances").instances == NEED
    # one fewer 39 and its half 19 pass, 9 fails; bisect 14 (pass), 11, 12 (fail), 13 (pass): 8 simulations, not 28 single steps
    assert run.runs == [40, 39, 19, 9, 14, 11, 12, 13]
    assert fitted.minimality[0].instances == NEED - 1 and fitted.minimality[0].failed is not None
    assert any("instances 13" in h and "still passes" in h for h in fitted.history)


def test_growth_stops_at_the_cost_limit_and_says_so():
    run = Counted()
    plan0 = _plan(g=5.0)
    limit = 6 * 2.0  # six one-GPU instances at $2/h: the need of 13 is out of reach
    fitted = fit(plan0, run, JUDGE, max_usd_per_hour=limit)
    assert not fitted.ok and fitted.minimality == ()
    assert (
        fitted.plan.usd_per_hour <= limit and fitted.plan.pool("instances").instances == 6
    )  # 1, 2, 4, then +2 (not +4: over the limit)
    assert fitted.limit_usd_per_hour == limit and fitted.failed is not None and fitted.failed.attainment == 0.5
    assert "one more instance of any pool would cost more than the limit $12.00/h: stopped" in fitted.history[-1]


def test_outages_are_covered_one_instance_above_the_need_per_scenario():
    run = Counted()
    surge = HeadroomParams(node_failures=0, max_surge=1, max_unavailable=0)  # an upgrade step takes one instance out
    fitted = fit(_plan(g=5.0, params=surge), run, JUDGE)
    assert fitted.ok and fitted.plan.pool("instances").instances == NEED + 1
    assert fitted.minimality[0].failed is not None and fitted.minimality[0].failed.scenario.name == "upgrade: instances"


NEED_PD = {"prefill": 5, "decode": 3}


def _pd_run(counts: Mapping[str, int]) -> EvalResult:
    """TTFT misses while prefill is short, ITL misses while decode is short (what the judge blames)."""
    short = {pool: counts[pool] < need for pool, need in NEED_PD.items()}
    metrics = {"ttft_misses": float(short["prefill"]), "itl_misses": float(short["decode"])}
    return EvalResult(0.5 if any(short.values()) else 1.0, metrics)


def test_coupled_pd_pools_settle_where_neither_moves():
    pools = [PoolInput("prefill", 5.0, 1, 8, 2.0), PoolInput("decode", 20.0, 1, 8, 3.0)]  # 1 + 1 to start
    plan0 = plan_headroom(RATE, pools, NO_OUTAGES)
    fitted = fit(plan0, _pd_run, Judge(0.99, 0.9, "decode", "prefill"))
    assert fitted.ok and fitted.plan.counts() == NEED_PD
    failed = {m.pool: m.failed for m in fitted.minimality}
    assert failed["prefill"] is not None and failed["prefill"].scenario.counts() == {"prefill": 4, "decode": 3}
    assert failed["decode"] is not None and failed["decode"].scenario.counts() == {"prefill": 5, "decode": 2}


def _misleading_pd_run(counts: Mapping[str, int]) -> EvalResult:
    """Every shortfall shows as TTFT misses (the judge blames prefill), though decode is short too."""
    short_p, short_d = max(0, NEED_PD["prefill"] - counts["prefill"]), max(0, NEED_PD["decode"] - counts["decode"])
    return EvalResult(
        1.0 - 0.05 * (short_p + short_d), {"ttft_misses": float(short_p + short_d > 0), "itl_misses": 0.0}
    )


def test_a_failure_that_points_at_the_wrong_pool_is_still_fixed():
    pools = [PoolInput("prefill", 5.0, 1, 8, 2.0), PoolInput("decode", 20.0, 1, 8, 3.0)]
    fitted = fit(
        plan_headroom(RATE, pools, NO_OUTAGES),
        _misleading_pd_run,
        Judge(0.99, 0.9, "decode", "prefill"),
        max_usd_per_hour=200.0,
    )
    # growing prefill alone would never pass: each step also tries the other pool and keeps the growth that moves the attainment more
    assert fitted.ok and fitted.plan.counts() == NEED_PD
    assert any("decode" in h.split("→")[-1] for h in fitted.history if "FAIL" in h)  # the decode pool was grown


class NeedOf(Counted):
    def __init__(self, need: int) -> None:
        super().__init__()
        self.need = need

    def __call__(self, counts: Mapping[str, int]) -> EvalResult:
        self.runs.append(counts["instances"])
        return EvalResult(1.0 if counts["instances"] >= self.need else 0.5)


def test_one_instance_that_passes_cannot_go_lower():
    run = NeedOf(1)
    fitted = fit(_plan(g=RATE), run, JUDGE)  # the excerpt's G carries the whole rate: 1 instance, and it passes
    assert fitted.ok and fitted.plan.pool("instances").instances == 1 and run.runs == [1]
    (m,) = fitted.minimality
    assert (m.pool, m.instances, m.failed, m.note) == ("instances", 0, None, "instances: 1 instance, cannot go lower")
    assert fitted.history == ("instances 1: every scenario passes",)


def test_a_plan_one_above_its_need_steps_down_once_and_shows_the_failure():
    run = NeedOf(2)
    fitted = fit(_plan(g=RATE / 3), run, JUDGE)  # 3 instances planned, 2 needed
    assert fitted.ok and fitted.plan.pool("instances").instances == 2
    assert run.runs == [3, 2, 1]  # one fewer passes; the next one fewer fails: the evidence
    (m,) = fitted.minimality
    assert (m.pool, m.instances) == ("instances", 1) and m.failed is not None and m.failed.attainment == 0.5
    assert m.note == f"instances at 1: {m.failed.describe()}"
    assert fitted.history == (
        "instances 3: every scenario passes",
        "instances 2: every scenario still passes → instances 2",
    )


def test_growth_from_one_below_bisects_nothing_it_already_knows():
    run = NeedOf(2)
    fitted = fit(_plan(g=RATE), run, JUDGE)  # 1 instance planned, 2 needed
    assert fitted.ok and fitted.plan.pool("instances").instances == 2
    assert run.runs == [1, 2]  # 1 failed already: it is the evidence, not simulated again
    assert fitted.minimality[0].instances == 1 and fitted.minimality[0].failed.attainment == 0.5
    assert fitted.history == (
        "instances 1: traffic [instances 1]: attainment 0.5000 → FAIL → +1 instances",
        "instances 2: every scenario passes",
    )


def test_a_cost_limit_equal_to_the_plans_cost_still_allows_it():
    run = Counted()
    limit = NEED * 2.0  # 13 one-GPU instances at $2/h: exactly the limit
    fitted = fit(_plan(g=5.0), run, JUDGE, max_usd_per_hour=limit)
    assert fitted.ok and fitted.plan.pool("instances").instances == NEED and fitted.plan.usd_per_hour == limit
