"""The count's uncertainty on hand-made cases: each seed's own max rate from the search, the base count near an
integer boundary, and the count's range across seeds from the scenarios re-run on each seed."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from llmcap.sizing.headroom import PoolInput, plan_headroom
from llmcap.sizing.params import HeadroomParams, SearchParams
from llmcap.sizing.scenarios import Judge, fit
from llmcap.sizing.search import EvalResult, search_max_rate
from llmcap.sizing.uncertainty import count_range, pool_spread, seed_max_rates

THRESHOLD = {0: 10.0, 1: 8.0, 2: 9.3}  # each seed's true max rate


def _step(rate: float, seed: int) -> EvalResult:
    return EvalResult(1.0 if rate <= THRESHOLD[seed] else 0.5)


def test_each_seed_gets_its_own_max_rate_from_the_searchs_evaluations():
    res = search_max_rate(_step, 0.99, SearchParams(seeds=(0, 1, 2), rel_tol=0.02, guard_points=0), initial_rate=1.0)
    rates = seed_max_rates(res)
    tried = sorted({p.rate for p in res.points})
    for seed, thr in THRESHOLD.items():
        assert rates[seed] == max(
            r for r in tried if r <= thr
        )  # the highest rate the search tried that this seed holds
    assert min(rates.values()) == res.max_rate  # every seed must hold: the answer is the slowest seed's


@pytest.mark.parametrize(("rates", "rate", "near"), [({0: 0.5, 1: 0.45}, 3.4, True), ({0: 0.5, 1: 0.49}, 3.2, False)])
def test_base_count_within_noise_of_the_next_integer(rates, rate, near):
    s = pool_spread("prefill", rates, rate)
    assert s.base == pytest.approx((rate / max(rates.values()), rate / min(rates.values())))
    assert s.near_integer is near
    assert ("within seed noise" in s.describe()) is near


G = {0: 1.0, 1: 1.3, 2: 0.9}  # per-instance rate each seed's replay sustains
RATE = 5.0


def _run(counts: Mapping[str, int], seed: int) -> EvalResult:
    return EvalResult(1.0 if counts["instances"] * G[seed] >= RATE else 0.5)


def test_range_across_seeds_contains_the_point_answer_and_moves_by_whole_instances():
    params = HeadroomParams(node_failures=1, max_surge=1)
    plan0 = plan_headroom(RATE, [PoolInput("instances", G[0], 2, 8, 2.0)], params)
    judge = Judge(0.99, 0.9, "instances", None)
    fitted = fit(plan0, lambda c: _run(c, 0), judge)
    assert fitted.ok
    plan = fitted.plan
    # seed 0 needs 5 serving: the fitted plan keeps exactly 5 after its worst outage
    worst = max(plan.pool("instances").node_loss, plan.pool("instances").upgrading)
    assert plan.pool("instances").instances - worst == 5
    spread = pool_spread("instances", G, RATE)
    cr = count_range(plan, _run, judge, 0, [1, 2], [spread])
    # seed 1 (G 1.3) holds 5 req/s on 4 serving: one fewer passes → −1 instance; seed 2 (G 0.9) needs 6: fails → +1
    assert (cr.low_gpus, cr.point_gpus, cr.high_gpus) == (plan.total_gpus - 2, plan.total_gpus, plan.total_gpus + 2)
    by_seed = {c.seed: c for c in cr.checks}
    assert by_seed[1].failed is None and by_seed[1].fewer_passes == ("instances",)
    assert by_seed[2].failed is not None and by_seed[2].failed.blame == "instances" and by_seed[2].fewer_passes == ()
    d = cr.as_dict()
    assert d["low_gpus"] <= d["point_gpus"] <= d["high_gpus"] and d["seeds"] == [0, 1, 2]
    assert d["near_integer"] == {"instances": True}  # 5/1.3 = 3.8 … 5/0.9 = 5.6: four, five or six instances
    assert cr.lines()[0].startswith(f"{plan.total_gpus} GPUs ({plan.total_gpus - 2}–{plan.total_gpus + 2} over seeds)")
    assert cr.lines()[1].startswith(f"GPU count {cr.low_gpus}–{cr.high_gpus} across seeds 0, 1, 2")


def test_the_model_error_ends_widen_the_range_and_say_what_they_assume():
    from dataclasses import replace

    from llmcap.sizing.uncertainty import ModelErrorEnd

    cr = replace(
        _range_at_seeds(),
        model_error=(
            ModelErrorEnd("faster", {"instances": 0.88}, {"instances": "roofline: held-out 12%"}, 12, {"instances": 6}),
            ModelErrorEnd(
                "slower", {"instances": 1.12}, {"instances": "roofline: held-out 12%"}, 22, {"instances": 11}
            ),
        ),
    )
    assert (cr.point_gpus, cr.low_gpus, cr.high_gpus) == (18, 16, 20) and (cr.low, cr.high) == (
        12,
        22,
    )  # ends outside the seeds
    assert cr.headline() == "18 GPUs (12–22 over seeds and the step-time model's error)"
    assert (
        "step times slower by the model's own error — instances ×1.12 (roofline: held-out 12%): 22 GPUs (instances 11)"
        in cr.lines()
    )
    unreachable = replace(cr, model_error=(*cr.model_error[:1], replace(cr.model_error[1], gpus=None)))
    assert unreachable.high is None and "12–no passing count" in unreachable.headline()
    assert cr.as_dict()["low"] == 12 and cr.as_dict()["high"] == 22


def _range_at_seeds():
    params = HeadroomParams(node_failures=1, max_surge=1)
    plan0 = plan_headroom(RATE, [PoolInput("instances", G[0], 2, 8, 2.0)], params)
    judge = Judge(0.99, 0.9, "instances", None)
    plan = fit(plan0, lambda c: _run(c, 0), judge).plan
    return count_range(plan, _run, judge, 0, [1, 2], [pool_spread("instances", G, RATE)])


def test_parallel_checks_give_the_same_fit_and_spend_little_past_a_failure():
    from llmcap.sizing.scenarios import Parallel

    params = HeadroomParams(node_failures=1, max_surge=1)
    plan0 = plan_headroom(RATE, [PoolInput("instances", G[0], 2, 8, 2.0)], params)
    judge = Judge(0.99, 0.9, "instances", None)
    one_by_one: list[dict] = []
    batches: list[list[dict]] = []

    def run(c):
        one_by_one.append(dict(c))
        return _run(c, 0)

    def run_many(many):
        batches.append([dict(c) for c in many])
        return [_run(c, 0) for c in many]

    serial = fit(plan0, run, judge)
    together = fit(plan0, lambda c: _run(c, 0), judge, parallel=Parallel(run_many, 2))
    assert together == serial  # the same plan, scenario results, history and minimality evidence
    assert all(1 <= len(b) <= 2 for b in batches)
    ran = [c for b in batches for c in b]
    assert len(set(map(str, ran))) == len(ran)  # each deployment simulated once
    assert len(ran) <= len(one_by_one) + len(batches)  # at most one extra (width − 1) per batch
