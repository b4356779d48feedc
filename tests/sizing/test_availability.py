"""The availability target (`slo.availability`, `llmcap.sizing.availability`) on hand-made deployments: the
share of time each state lasts, the weighted attainment exactly at and past the target, an overloaded state
counting as nothing, the pool it blames, and a fit whose answer it changes.

Failure numbers are chosen so that every share is a binary fraction: MTBF 1,023 h and a 1 h repair make a node
down d = 1 / (1,023 + 1) = 1/1,024 of the time, so the sums below are exact in floating point."""

from __future__ import annotations

import pytest

from llmcap.errors import LlmcapError
from llmcap.sizing import availability
from llmcap.sizing.headroom import PoolInput, plan_headroom
from llmcap.sizing.params import HeadroomParams, SloParams
from llmcap.sizing.scenarios import Judge, check, fit, scenarios
from llmcap.sizing.search import EvalResult
from tests.sizing.test_scenario_fit import NEED, Counted  # attainment 1.0 with at least 13 instances serving, else 0.5

# no N+1 node and no upgrade step: only the availability target asks for more than the traffic needs
PACKED = HeadroomParams(node_failures=0, max_surge=0, max_unavailable=0, node_mtbf_h=1023.0, node_repair_h=1.0)


def _plan(instances: int, params: HeadroomParams = PACKED):
    # one-GPU instances on 8-GPU nodes: packed 8 per node (no node loss planned for, so no spreading)
    plan = plan_headroom(5.0, [PoolInput("instances", 5.0, 1, 8, 2.0)], params)
    return plan.with_counts({"instances": instances})


def _judge(target: float | None) -> Judge:
    return Judge(0.99, 0.9, "instances", None, target)


def test_the_states_and_their_shares_of_the_time() -> None:
    # 13 instances packed 8 + 5 on 2 nodes: a node down 2/1,024 of the time, and then the fullest (8) is lost
    assert availability.node_down_share(PACKED) == 1 / 1024
    every, down = availability.states(_plan(13))
    assert (every.serving, every.share, every.down) == ((("instances", 13),), 1 - 2 / 1024, "")
    assert (down.serving, down.share, down.down) == ((("instances", 5),), 2 / 1024, "instances")
    assert availability.node_down_share(HeadroomParams(node_mtbf_h=6335.0, node_repair_h=0.0)) == 0.0
    never_down = _plan(13, PACKED.model_copy(update={"node_repair_h": 0.0}))
    (only,) = availability.states(never_down)
    assert only.share == 1.0  # nodes that never stay down: one state
    assert scenarios(never_down, over_time=True)[-1].reasoning == "over time: no node is ever down"
    with pytest.raises(LlmcapError) as err:
        availability.states(
            _plan(13, PACKED.model_copy(update={"node_mtbf_h": 1.0}))
        )  # d = 1 / (1 + 1) per node, 2 nodes: 100%
    assert str(err.value) == (
        "availability: nodes are down 100.0% of the time (node_repair_h vs node_mtbf_h); "
        "one node down at a time no longer describes it"
    )
    # eight-GPU instances on eight-GPU nodes: one per node, 3 nodes, a node down loses 1 instance
    wide = plan_headroom(5.0, [PoolInput("instances", 5.0, 8, 8, 2.0)], PACKED).with_counts({"instances": 3})
    assert [(s.serving, s.share) for s in availability.states(wide)] == [
        ((("instances", 3),), 1 - 3 / 1024),
        ((("instances", 2),), 3 / 1024),
    ]


def test_the_verdict_exactly_at_and_past_the_target() -> None:
    plan = _plan(13)
    (sc,) = [s for s in scenarios(plan, over_time=True) if s.name == "availability"]
    assert (sc.reasoning, sc.reduced, sc.serving) == (
        "over time: instances node down 0.195% of the time",
        "",
        (("instances", 13),),
    )
    served = {(("instances", 13),): EvalResult(1.0), (("instances", 5),): EvalResult(0.5)}
    # A = (1 − 2/1,024) × 1 + 2/1,024 × 0.5 = 1 − 1/1,024 = 0.9990234375
    at = _judge(1 - 1 / 1024).judged(sc, served)
    assert at.passed and at.attainment == 1 - 1 / 1024 and at.blame == ""
    past = _judge(1 - 1 / 1024 + 2**-20).judged(sc, served)
    assert not past.passed and past.blame == "instances"  # the node-down state loses 1/1,024, the rest nothing
    assert f"FAIL (< {1 - 1 / 1024 + 2**-20:g}: all serving" in past.describe() and (past.overload, past.run_miss) == (
        "",
        "",
    )
    assert "(≥ 0.999023: all serving 99.805% × 1.0000; instances node down 0.195% × 0.5000)" in at.describe()
    # an overloaded node-down state serves nothing over a repair's hours: A = 1 − 2/1,024
    overloaded = served | {(("instances", 5),): EvalResult(0.5, overload="median TTFT rose")}
    assert _judge(0.5).judged(sc, overloaded).attainment == 1 - 2 / 1024


def test_p_d_blames_the_state_that_loses_the_most_requests() -> None:
    # prefill: 4 one-GPU instances packed on 1 node; decode: 2 four-GPU instances on 1 node. Each pool has a node
    # down 1/1,024 of the time (4 and 2 lost), every instance serving 1 − 2/1,024
    pools = [PoolInput("prefill", 1.25, 1, 8, 2.0), PoolInput("decode", 2.5, 4, 8, 2.0)]
    plan = plan_headroom(5.0, pools, PACKED).with_counts({"prefill": 4, "decode": 2})
    (sc,) = [s for s in scenarios(plan, over_time=True) if s.name == "availability"]
    assert sc.reasoning == "over time: prefill node down 0.098%, decode node down 0.098% of the time"
    every, no_prefill, no_decode = (
        (("prefill", 4), ("decode", 2)),
        (("prefill", 0), ("decode", 2)),
        (("prefill", 4), ("decode", 0)),
    )
    assert [(s.serving, s.share) for s in sc.states] == [
        (every, 1 - 2 / 1024),
        (no_prefill, 1 / 1024),
        (no_decode, 1 / 1024),
    ]
    judge = Judge(0.99, 0.9, "decode", "prefill", 0.999)
    down = {no_prefill: EvalResult(0.0), no_decode: EvalResult(0.0)}  # a pool with nothing left serves nothing
    # every instance serving misses 1%, mostly TTFT: (1 − 2/1,024) × 0.01 ≈ 0.00998 lost, more than 1/1,024 per node state
    ttft_bound = judge.judged(sc, down | {every: EvalResult(0.99, {"ttft_misses": 5.0, "itl_misses": 1.0})})
    assert not ttft_bound.passed and ttft_bound.blame == "prefill"
    itl_bound = judge.judged(sc, down | {every: EvalResult(0.99, {"ttft_misses": 1.0, "itl_misses": 5.0})})
    assert itl_bound.blame == "decode"
    # every instance serving is perfect: the two node-down states lose 1/1,024 each; the tie goes to the first (prefill)
    tie = judge.judged(sc, down | {every: EvalResult(1.0)})
    assert tie.attainment == 1 - 2 / 1024 and tie.blame == "prefill"
    decode_worse = judge.judged(sc, {every: EvalResult(1.0), no_prefill: EvalResult(0.5), no_decode: EvalResult(0.0)})
    assert decode_worse.attainment == 1 - 2 / 1024 + 0.5 / 1024 and decode_worse.blame == "decode"


def test_no_target_no_availability_scenario() -> None:
    plan = _plan(13)
    assert [s.name for s in scenarios(plan)] == ["traffic"]
    assert [r.scenario.name for r in check(plan, Counted(), _judge(None), {})] == ["traffic"]


def test_the_target_changes_the_answer_and_shares_the_scenarios_runs() -> None:
    # without it: 13. With 0.9995: at n instances on ⌈n/8⌉ nodes the fullest node (8) down must leave ≥ 13
    # serving, since with 0.5 served then A = 1 − ⌈n/8⌉/1,024 × 0.5 < 0.9995 for any 2+ nodes (2/2,048 ≈ 0.00098 > 0.0005).
    # n = 21 (8 + 8 + 5; 13 left) passes, n = 20 (8 + 8 + 4; 12 left) fails: A = 1 − 3/2,048 = 0.99854
    assert fit(_plan(13), Counted(), _judge(None)).plan.pool("instances").instances == NEED
    run = Counted()
    fitted = fit(_plan(13), run, _judge(0.9995))
    assert fitted.ok and fitted.plan.pool("instances").instances == 21
    (evidence,) = fitted.minimality
    assert evidence.instances == 20 and evidence.failed is not None and evidence.failed.scenario.name == "availability"
    assert evidence.failed.attainment == 1 - 3 / 2048
    assert len(run.runs) == len(set(run.runs))  # each deployment simulated once, whichever scenario needed it
    # with a node loss planned for, its scenario and the node-down state are the same deployment: one simulation
    spread = PACKED.model_copy(update={"node_failures": 1})
    run = Counted()
    results = check(_plan(26, spread), run, _judge(0.9995), {})
    assert [r.scenario.name for r in results] == ["node loss: instances", "traffic", "availability"] and all(
        r.passed for r in results
    )
    assert run.runs == [18, 26]  # 26 spread 8 + 8 + 8 + 2: the fullest node down leaves 18, in both scenarios


def test_an_availability_target_is_an_slo_field() -> None:
    assert SloParams(availability=0.999).availability == 0.999
    with pytest.raises(ValueError):
        SloParams(availability=1.0)  # every request forever: no plan can promise it
