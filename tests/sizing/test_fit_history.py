"""The scenario fit step by step (llmcap.sizing.scenarios), on hand-made step-function deployments whose
minimum is known: the whole history from under- and over-provisioned plans, the growth step cut at the
cost limit, a node loss grown by a whole node's share, a stale known-failing count that minimality
still checks, the plan that passes only above the limit; `check`'s order, early stop and batching;
a pool left at 0; the judge's blame when a miss count is absent; and what a verdict says."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pytest

from llmcap.sizing.headroom import PoolInput, plan_headroom
from llmcap.sizing.params import HeadroomParams
from llmcap.sizing.scenarios import Judge, Parallel, Scenario, ScenarioResult, _survivor_step, check, fit, scenarios
from llmcap.sizing.search import EvalResult

RATE = 5.0
NO_OUTAGES = HeadroomParams(node_failures=0, max_surge=0, max_unavailable=0)
NODE_LOSS = HeadroomParams(node_failures=1, max_surge=0, max_unavailable=0)
JUDGE = Judge(0.99, 0.9, "instances", None)


class Need:
    """Attainment 1.0 with at least `need` instances serving, else 0.5; records each simulated count."""

    def __init__(self, need: int) -> None:
        self.need = need
        self.runs: list[int] = []

    def __call__(self, counts: Mapping[str, int]) -> EvalResult:
        self.runs.append(counts["instances"])
        return EvalResult(1.0 if counts["instances"] >= self.need else 0.5)


def _plan(instances: int, params: HeadroomParams = NO_OUTAGES, gpus_per_instance: int = 1):
    """One pool planned at exactly `instances` (G = RATE / instances: λ / G is a whole number), $2 per GPU-hour."""
    plan = plan_headroom(RATE, [PoolInput("instances", RATE / instances, gpus_per_instance, 8, 2.0)], params)
    return plan.with_counts({"instances": instances})


FAIL_AT = "traffic [instances {n}]: attainment 0.5000 → FAIL"


# ---- fit from below and from above ------------------------------------------------------------------------


def test_from_one_instance_the_fit_doubles_its_steps_then_bisects_down_to_the_need() -> None:
    run = Need(13)
    fitted = fit(_plan(1), run, JUDGE)
    assert fitted.history == (
        f"instances 1: {FAIL_AT.format(n=1)} → +1 instances",
        f"instances 2: {FAIL_AT.format(n=2)} → +2 instances",
        f"instances 4: {FAIL_AT.format(n=4)} → +4 instances",
        f"instances 8: {FAIL_AT.format(n=8)} → +8 instances",
        "instances 16: every scenario passes",
        # bisect between 8 (failed) and 16: 12 fails, 14 passes, 13 passes; 12 is the evidence (no new run)
        "instances 14: every scenario still passes → instances 14",
        "instances 13: every scenario still passes → instances 13",
    )
    assert run.runs == [1, 2, 4, 8, 16, 12, 14, 13]
    assert fitted.ok is True and fitted.plan.counts() == {"instances": 13}
    assert [r.describe() for r in fitted.results] == [
        "traffic [instances 13]: attainment 1.0000 → pass"
    ] and fitted.failed is None
    (m,) = fitted.minimality
    assert (m.pool, m.instances, m.note) == ("instances", 12, f"instances at 12: {FAIL_AT.format(n=12)}")


def test_from_forty_instances_the_fit_halves_then_bisects_down_to_the_need() -> None:
    run = Need(13)
    fitted = fit(_plan(40), run, JUDGE)
    assert fitted.history == (
        "instances 40: every scenario passes",
        "instances 39: every scenario still passes → instances 39",  # one fewer passes
        "instances 19: every scenario still passes → instances 19",  # 39 // 2; then 9 fails
        "instances 14: every scenario still passes → instances 14",  # (9 + 19) // 2; then 11, 12 fail
        "instances 13: every scenario still passes → instances 13",  # (12 + 14) // 2
    )
    assert run.runs == [40, 39, 19, 9, 14, 11, 12, 13]
    assert fitted.ok is True and fitted.plan.counts() == {"instances": 13} and fitted.minimality[0].instances == 12


def test_a_stale_known_failing_count_only_skips_ahead_minimality_still_steps_down() -> None:
    # 16 planned, 14 said to fail (e.g. with faster step times) but the need is 13: bisect (14, 16) → 15 passes,
    # then one fewer at a time: 14 and 13 pass, 12 fails
    run = Need(13)
    fitted = fit(_plan(16), run, JUDGE, known_failing={"instances": 14})
    assert fitted.history == (
        "instances 16: every scenario passes",
        "instances 15: every scenario still passes → instances 15",
        "instances 14: every scenario still passes → instances −1",
        "instances 13: every scenario still passes → instances −1",
    )
    assert run.runs == [16, 15, 14, 13, 12] and fitted.plan.counts() == {"instances": 13}


def test_a_known_failing_count_above_the_growths_own_is_kept() -> None:
    # growth 1, 2, 4, 8 fail, 16 passes; 12 is known to fail: the bisection starts from (12, 16), not (8, 16)
    run = Need(13)
    fitted = fit(_plan(1), run, JUDGE, known_failing={"instances": 12})
    assert run.runs == [1, 2, 4, 8, 16, 14, 13, 12] and fitted.plan.counts() == {"instances": 13}


def test_a_known_failing_count_of_one_is_bisected_from() -> None:
    # 16 pass; 1 is known to fail: bisect (1, 16) → 8 fails, 12 fails, 14 passes, 13 passes — no "one fewer" at 15
    run = Need(13)
    fitted = fit(_plan(16), run, JUDGE, known_failing={"instances": 1})
    assert run.runs == [16, 8, 12, 14, 13]
    assert fitted.history == (
        "instances 16: every scenario passes",
        "instances 14: every scenario still passes → instances 14",
        "instances 13: every scenario still passes → instances 13",
    )


def test_a_known_failing_count_at_the_passing_count_is_ignored() -> None:
    # 16 passes, so "16 fails" cannot be used: one fewer (15 passes), halve (7 fails), bisect 11 (fails), 13, 12
    run = Need(13)
    fitted = fit(_plan(16), run, JUDGE, known_failing={"instances": 16})
    assert run.runs == [16, 15, 7, 11, 13, 12]
    assert fitted.history == (
        "instances 16: every scenario passes",
        "instances 15: every scenario still passes → instances 15",
        "instances 13: every scenario still passes → instances 13",
    )


@pytest.mark.parametrize(
    ("limit", "stopped_at", "last_step"),
    [
        # $22/h = 11 instances at $2: from 8 the doubled step 8 is cut to 3 (8 + 3 = 11 costs exactly the limit)
        (22.0, 11, "+3"),
        # $18/h = 9: the step is cut all the way to 1
        (18.0, 9, "+1"),
    ],
)
def test_a_growth_step_is_cut_one_at_a_time_to_fit_the_cost_limit(
    limit: float, stopped_at: int, last_step: str
) -> None:
    fitted = fit(_plan(1), Need(13), JUDGE, max_usd_per_hour=limit)
    assert fitted.history[3] == f"instances 8: {FAIL_AT.format(n=8)} → {last_step} instances"
    assert fitted.history[4] == (
        f"instances {stopped_at}: {FAIL_AT.format(n=stopped_at)}; one more instance of any pool would cost "
        f"more than the limit ${limit:,.2f}/h: stopped"
    )
    assert len(fitted.history) == 5 and fitted.ok is False and fitted.plan.counts() == {"instances": stopped_at}
    assert fitted.minimality == () and fitted.limit_usd_per_hour == limit


def test_a_plan_that_passes_only_above_the_cost_limit_is_not_ok_and_says_so() -> None:
    # 40 instances pass; the minimum, 13, still costs 13 × $2 = $26/h > $20/h
    fitted = fit(_plan(40), Need(13), JUDGE, max_usd_per_hour=20.0)
    assert fitted.ok is False and fitted.plan.counts() == {"instances": 13} and fitted.limit_usd_per_hour == 20.0
    assert fitted.history[-1] == "instances 13: passes every scenario only at $26.00/h, over the limit $20.00/h"
    assert len(fitted.history) == 6 and fitted.minimality[0].instances == 12
    assert [r.passed for r in fitted.results] == [True] and fitted.failed is None


def test_a_node_loss_is_grown_by_a_whole_nodes_share() -> None:
    # 2-GPU instances on 8-GPU nodes, one node may be lost: 4 instances sit 2 + 2, a loss leaves 2; the run needs 3.
    # +1 (5 = 3 + 2) would still leave 2, so the first step is +2 (6 = 3 + 3 leaves 3). Then 5 is the evidence.
    run = Need(3)
    fitted = fit(_plan(4, NODE_LOSS, gpus_per_instance=2), run, JUDGE)
    assert fitted.history == (
        "instances 4: node loss: instances [instances 2]: attainment 0.5000 → FAIL → +2 instances",
        "instances 6: every scenario passes",
    )
    (m,) = fitted.minimality
    assert m.instances == 5 and m.failed is not None and m.failed.scenario.name == "node loss: instances"
    # serving counts simulated: 4's node loss (2), the grown plan's node loss (3), 6's traffic (6); 5 loses 3 of 3 + 2
    # and leaves 2, already simulated
    assert run.runs == [2, 3, 6]


# ---- check: order, early stop, batches ---------------------------------------------------------------------


def _three_scenarios():
    # 8 two-GPU instances, 4 per node, one node lost and one surge instance: node loss leaves 4, upgrade 7, traffic 8
    return _plan(8, HeadroomParams(node_failures=1, max_surge=1, max_unavailable=0), gpus_per_instance=2)


class Batches:
    """A `Parallel.run_many` that records each batch (one pool: its serving counts; P/D: the deployments)."""

    def __init__(self, run: Callable[[Mapping[str, int]], EvalResult]) -> None:
        self.run, self.batches = run, []

    def __call__(self, deployments: Sequence[Mapping[str, int]]) -> list[EvalResult]:
        self.batches.append([d["instances"] if len(d) == 1 else dict(d) for d in deployments])
        return [self.run(d) for d in deployments]


def _no_single_runs(counts: Mapping[str, int]) -> EvalResult:
    raise AssertionError("simulated one at a time: the parallel runner was not used")


def test_check_judges_every_scenario_thinnest_first_when_all_pass() -> None:
    run = Need(1)
    results = check(_three_scenarios(), run, JUDGE, {})
    assert [r.scenario.name for r in results] == ["node loss: instances", "upgrade: instances", "traffic"]
    assert [r.passed for r in results] == [True, True, True] and run.runs == [4, 7, 8]


def test_check_stops_at_the_first_failure_and_simulates_nothing_past_it() -> None:
    run = Need(5)
    results = check(_three_scenarios(), run, JUDGE, {})
    assert [(r.scenario.name, r.passed, r.blame) for r in results] == [("node loss: instances", False, "instances")]
    assert run.runs == [4]


def test_check_with_parallel_simulates_width_at_a_time() -> None:
    batches = Batches(Need(5))
    results = check(_three_scenarios(), _no_single_runs, JUDGE, {}, Parallel(batches, 2))
    assert len(results) == 1 and batches.batches == [[4, 7]]  # at most width − 1 = 1 simulation past the failure
    everything = Batches(Need(1))
    assert len(check(_three_scenarios(), _no_single_runs, JUDGE, {}, Parallel(everything, 2))) == 3
    assert everything.batches == [[4, 7], [8]]


def test_check_with_a_parallel_width_of_one_runs_one_at_a_time() -> None:
    run, batches = Need(5), Batches(Need(5))
    results = check(_three_scenarios(), run, JUDGE, {}, Parallel(batches, 1))
    assert len(results) == 1 and run.runs == [4] and batches.batches == []


def test_fit_with_parallel_runs_every_simulation_through_it() -> None:
    serial = fit(_plan(1), Need(13), JUDGE)
    batches = Batches(Need(13))
    parallel = fit(_plan(1), _no_single_runs, JUDGE, parallel=Parallel(batches, 2))
    assert parallel.history == serial.history and parallel.plan.counts() == {"instances": 13}
    assert [n for b in batches.batches for n in b] == [1, 2, 4, 8, 16, 12, 14, 13]


def test_a_pool_left_at_zero_fails_without_a_simulation() -> None:
    # one 2-GPU instance on one node: a node loss (and an upgrade step) leaves none serving
    run = Need(1)
    plan = _plan(4, HeadroomParams(node_failures=1, max_surge=1, max_unavailable=0), gpus_per_instance=2).with_counts(
        {"instances": 1}
    )
    (res,) = check(plan, run, JUDGE, {})
    assert run.runs == []
    assert (res.attainment, res.overload, res.passed) == (0.0, "no instances instance left serving", False)
    assert (
        res.describe()
        == "node loss: instances [instances 0]: attainment 0.0000 → FAIL (overloaded: no instances instance left serving)"
    )


# ---- growth steps, scenarios ------------------------------------------------------------------------------------


def test_the_survivor_step_leaves_one_more_instance_serving() -> None:
    plan = _plan(4, HeadroomParams(node_failures=1, max_surge=1, max_unavailable=0), gpus_per_instance=2)
    by_name = {sc.name: sc for sc in scenarios(plan)}
    # node loss: 4 sit 2 + 2 and leave 2; 5 sit 3 + 2 and leave 2; 6 sit 3 + 3 and leave 3: +2
    assert _survivor_step(plan, "instances", by_name["node loss: instances"]) == 2
    # upgrade: one instance out of 4 leaves 3; 5 leave 4: +1
    assert _survivor_step(plan, "instances", by_name["upgrade: instances"]) == 1
    # a scenario that takes nothing from this pool: +1
    assert _survivor_step(plan, "instances", by_name["traffic"]) == 1


def test_the_scenarios_of_a_plan_name_what_each_takes_out() -> None:
    plan = _plan(8, HeadroomParams(node_failures=1, max_surge=1, max_unavailable=1), gpus_per_instance=2)
    assert scenarios(plan) == [
        Scenario("traffic", (("instances", 8),), "all planned instances at 5 req/s"),
        Scenario(
            "node loss: instances",
            (("instances", 4),),
            "the fullest 1 node(s) of the instances pool lost: −4",
            "instances",
        ),
        Scenario(
            "upgrade: instances",
            (("instances", 6),),
            "one rolling-upgrade step of the instances pool out of service: −2",
            "instances",
        ),
    ]
    assert [sc.name for sc in scenarios(_plan(8))] == ["traffic"]  # no outage planned: nothing taken out, no scenario


# ---- the judge and its verdict's words --------------------------------------------------------------------------

PD = Judge(0.99, 0.9, "decode", "prefill")
STEADY = Scenario("traffic", (("prefill", 2), ("decode", 2)), "every instance serving")


@pytest.mark.parametrize(
    ("metrics", "blame"),
    [
        ({}, "prefill"),  # neither miss counted: 0 TTFT ≥ 0 ITL
        ({"itl_misses": 0.5}, "decode"),  # no TTFT count is 0 TTFT misses: 0 < 0.5
        ({"ttft_misses": 0.5}, "prefill"),  # no ITL count is 0 ITL misses: 0.5 ≥ 0
    ],
)
def test_a_missing_miss_count_is_zero_when_blaming(metrics: dict, blame: str) -> None:
    verdict = PD(STEADY, EvalResult(0.5, metrics))
    assert not verdict.passed and verdict.blame == blame


def test_the_verdict_carries_the_runs_overload_and_run_level_miss() -> None:
    r = PD(
        STEADY,
        EvalResult(0.95, {"kv_p99_share": 0.934}, overload="queue still growing", run_miss="token-level ITL p99"),
    )
    assert (r.overload, r.run_miss, r.kv_p99_share, r.passed, r.blame) == (
        "queue still growing",
        "token-level ITL p99",
        0.934,
        False,
        "decode",
    )
    assert r.describe() == (
        "traffic [prefill 2, decode 2]: attainment 0.9500, KV p99 93% → FAIL (overloaded: queue still growing) "
        "(token-level ITL p99)"
    )


def test_a_passing_verdict_says_pass_and_its_kv_share() -> None:
    r = ScenarioResult(STEADY, 0.995, "", "", 0.5, True, "")
    assert r.describe() == "traffic [prefill 2, decode 2]: attainment 0.9950, KV p99 50% → pass"
    assert ScenarioResult(STEADY, 0.5, "", "token-level ITL p99", None, False, "decode").describe() == (
        "traffic [prefill 2, decode 2]: attainment 0.5000 → FAIL (token-level ITL p99)"
    )


# ---- P/D: both growths compared ----------------------------------------------------------------------------------

NEED_PD = {"prefill": 5, "decode": 3}


def _misleading_pd_run(counts: Mapping[str, int]) -> EvalResult:
    """Every shortfall shows as TTFT misses (the judge blames prefill); each missing instance costs 0.05 attainment."""
    short = max(0, NEED_PD["prefill"] - counts["prefill"]) + max(0, NEED_PD["decode"] - counts["decode"])
    return EvalResult(1.0 - 0.05 * short, {"ttft_misses": float(short > 0), "itl_misses": 0.0})


def test_each_growth_step_compares_both_pools_and_says_so() -> None:
    pools = [PoolInput("prefill", 5.0, 1, 8, 2.0), PoolInput("decode", 20.0, 1, 8, 3.0)]  # 1 + 1 to start
    fitted = fit(plan_headroom(RATE, pools, NO_OUTAGES), _misleading_pd_run, PD, max_usd_per_hour=200.0)
    # 1 + 1: 4 + 2 short = 0.70; +1 prefill or +1 decode: 5 short = 0.75 each, a tie: the pool blamed (prefill)
    assert fitted.history[0] == (
        "prefill 1, decode 1: traffic [prefill 1, decode 1]: attainment 0.7000 → FAIL → +1 prefill "
        "(+1 prefill: 0.7500; +1 decode: 0.7500)"
    )
    # 2 + 1: prefill again, its step doubled: +2 (4 + 1: 1 + 2 short = 0.85) against +1 decode (2 + 2: 3 + 1 short = 0.80)
    assert fitted.history[1] == (
        "prefill 2, decode 1: traffic [prefill 2, decode 1]: attainment 0.7500 → FAIL → +2 prefill "
        "(+2 prefill: 0.8500; +1 decode: 0.8000)"
    )
    assert fitted.ok is True and fitted.plan.counts() == NEED_PD


def _prefill_keeps_up(counts: Mapping[str, int]) -> EvalResult:
    """Passes with at least 2 decode instances and one more prefill instance than decode ones (coupled pools)."""
    short_p, short_d = counts["prefill"] < counts["decode"] + 1, counts["decode"] < 2
    return EvalResult(0.5 if short_p or short_d else 1.0, {"ttft_misses": float(short_p), "itl_misses": float(short_d)})


def test_coupled_pools_are_settled_again_after_the_other_one_moves() -> None:
    pools = [PoolInput("prefill", RATE / 8, 1, 8, 2.0), PoolInput("decode", RATE / 4, 1, 8, 3.0)]  # 8 + 4, passing
    fitted = fit(plan_headroom(RATE, pools, NO_OUTAGES), _prefill_keeps_up, PD)
    assert fitted.history == (
        "prefill 8, decode 4: every scenario passes",
        # prefill at decode 4: 7 passes, 7 // 2 = 3 fails; bisect 5 (passes), 4 (fails)
        "prefill 7, decode 4: every scenario still passes → prefill 7",
        "prefill 5, decode 4: every scenario still passes → prefill 5",
        # decode at prefill 5: 3 passes, 1 fails; bisect 2 (passes)
        "prefill 5, decode 3: every scenario still passes → decode 3",
        "prefill 5, decode 2: every scenario still passes → decode 2",
        # prefill again, now at decode 2: 4 was its highest failing count, so one fewer at a time: 4 and 3 pass, 2 fails
        "prefill 4, decode 2: every scenario still passes → prefill −1",
        "prefill 3, decode 2: every scenario still passes → prefill −1",
    )
    assert fitted.ok is True and fitted.plan.counts() == {"prefill": 3, "decode": 2}
    failed = {m.pool: m.failed.scenario.counts() for m in fitted.minimality if m.failed is not None}
    assert failed == {"prefill": {"prefill": 2, "decode": 2}, "decode": {"prefill": 3, "decode": 1}}


def test_fit_with_parallel_checks_every_grown_plan_through_it() -> None:
    # an upgrade step takes one instance out: two scenarios per plan, so a grown plan has one not yet simulated
    surge = HeadroomParams(node_failures=0, max_surge=1, max_unavailable=0)
    serial = fit(_plan(1, surge), Need(13), JUDGE)
    batches = Batches(Need(13))
    parallel = fit(_plan(1, surge), _no_single_runs, JUDGE, parallel=Parallel(batches, 2))
    assert parallel.history == serial.history and parallel.plan.counts() == {"instances": 14} and batches.batches


def _two_each(counts: Mapping[str, int]) -> EvalResult:
    """Passes with at least 2 serving instances in each pool."""
    short_p, short_d = counts["prefill"] < 2, counts["decode"] < 2
    return EvalResult(0.5 if short_p or short_d else 1.0, {"ttft_misses": float(short_p), "itl_misses": float(short_d)})


def test_a_growth_simulated_for_the_comparison_is_read_back_when_the_grown_plan_is_checked() -> None:
    # 2-GPU instances, 4 a node, one node may be lost in either pool. Prefill 2 (1 + 1), decode 4 (2 + 2): a
    # width-3 check simulates decode's loss {2, 2} (passes) and prefill's loss {1, 4} (fails) at once; traffic
    # {2, 4} serves more than decode's loss in both pools, so the search leaves it to that. Growing prefill by a
    # node's share (+2: 4 sits 2 + 2, a loss leaves 2) and growing decode (+1) are compared: {2, 4} and {1, 5}
    pools = [PoolInput("prefill", RATE / 2, 2, 8, 2.0), PoolInput("decode", RATE / 4, 2, 8, 3.0)]
    plan = plan_headroom(RATE, pools, NODE_LOSS).with_counts({"prefill": 2, "decode": 4})
    batches = Batches(_two_each)
    fitted = fit(plan, _no_single_runs, PD, parallel=Parallel(batches, 3))
    assert fitted.history == (
        "prefill 2, decode 4: node loss: prefill [prefill 1, decode 4]: attainment 0.5000 → FAIL → +2 prefill "
        "(+2 prefill: 1.0000; +1 decode: 0.5000)",
        "prefill 4, decode 4: every scenario passes",
    )
    assert batches.batches[:3] == [
        [{"prefill": 2, "decode": 2}, {"prefill": 1, "decode": 4}],
        [{"prefill": 2, "decode": 4}, {"prefill": 1, "decode": 5}],
        # the grown plan: prefill's loss {2, 4} read back, decode's loss simulated, traffic {4, 4} implied
        [{"prefill": 4, "decode": 2}],
    ]
    # the plan the fit ends on has every scenario simulated: traffic last, once the one-fewer probes are done
    assert batches.batches[-1] == [{"prefill": 4, "decode": 4}]
    assert [r.scenario.name for r in fitted.results] == ["node loss: prefill", "node loss: decode", "traffic"]
    assert fitted.ok is True and fitted.plan.counts() == {"prefill": 4, "decode": 4}
    # prefill 3 sits 2 + 1 and decode 3 sits 2 + 1: a loss leaves 1 of either
    assert {m.pool: m.instances for m in fitted.minimality} == {"prefill": 3, "decode": 3}
