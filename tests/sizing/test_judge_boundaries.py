"""A scenario's verdict at each edge (llmcap.sizing.scenarios.Judge): attainment at the target, the P99
KV share at `kv_safe_fraction`, an unstable run, a run-level miss — and where each failure is blamed."""

from __future__ import annotations

import pytest

from llmcap.sizing.scenarios import Judge, Scenario
from llmcap.sizing.search import EvalResult

AGG = Judge(attainment_target=0.99, kv_safe_fraction=0.9, kv_pool="instances", prefill_pool=None)
PD = Judge(attainment_target=0.99, kv_safe_fraction=0.9, kv_pool="decode", prefill_pool="prefill")
ALL_SERVING = Scenario("steady", (("prefill", 2), ("decode", 2)), "every instance serving")
NODE_LOSS = Scenario("node loss: decode", (("prefill", 2), ("decode", 1)), "a node lost", reduced="decode")


@pytest.mark.parametrize(
    ("attainment", "kv_share", "passed"),
    [
        (0.99, 0.9, True),  # both exactly at their limits: the limits are inclusive
        (0.9899, 0.5, False),  # attainment just under the target
        (1.0, 0.9001, False),  # every request met, but the P99 KV share just past the safe fraction
        (1.0, None, True),  # no KV reading (a deployment that does not report it): attainment alone
    ],
)
def test_attainment_and_kv_safety_limits(attainment: float, kv_share: float | None, passed: bool) -> None:
    metrics = {} if kv_share is None else {"kv_p99_share": kv_share}
    verdict = AGG(ALL_SERVING, EvalResult(attainment, metrics))
    assert verdict.passed is passed
    assert verdict.kv_p99_share == kv_share
    assert verdict.blame == ("" if passed else "instances")


def test_a_run_that_is_unstable_or_misses_a_run_level_target_fails_whatever_its_attainment() -> None:
    assert not AGG(ALL_SERVING, EvalResult(1.0, overload="queue still growing")).passed
    assert not AGG(ALL_SERVING, EvalResult(1.0, run_miss="token-level ITL p99")).passed


@pytest.mark.parametrize(
    ("metrics", "run_miss", "blame"),
    [
        ({"ttft_misses": 5.0, "itl_misses": 1.0, "kv_p99_share": 0.5}, "", "prefill"),  # TTFT misses point at prefill
        ({"ttft_misses": 5.0, "itl_misses": 5.0, "kv_p99_share": 0.5}, "", "prefill"),  # a tie goes to prefill
        ({"ttft_misses": 1.0, "itl_misses": 5.0, "kv_p99_share": 0.5}, "", "decode"),
        (
            {"ttft_misses": 5.0, "itl_misses": 1.0, "kv_p99_share": 0.95},
            "",
            "decode",
        ),  # KV past its limit: decode, whatever TTFT says
        (
            {"ttft_misses": 5.0, "itl_misses": 1.0},
            "ITL token-level P99 120 ms > 100 ms",
            "decode",
        ),  # an ITL run-level miss is decode's
        (
            {"ttft_misses": 0.0, "itl_misses": 5.0},
            "TTFT P90 1200 ms > 1000 ms",
            "prefill",
        ),  # a TTFT one prefill's, whatever the counts say
        ({"ttft_misses": 0.0, "itl_misses": 5.0}, "queue time P99 300 ms > 200 ms", "prefill"),
        (
            {"ttft_misses": 5.0, "itl_misses": 0.0},
            "TTFT P90 1200 ms > 1000 ms; ITL token-level P99 120 ms > 100 ms",
            "decode",
        ),  # mixed: decode
        (
            {"ttft_misses": 5.0, "kv_p99_share": 0.95},
            "TTFT P90 1200 ms > 1000 ms",
            "decode",
        ),  # KV past its limit still decides
    ],
)
def test_pd_failures_are_blamed_on_the_pool_they_point_at(metrics: dict, run_miss: str, blame: str) -> None:
    verdict = PD(ALL_SERVING, EvalResult(0.5, metrics, run_miss=run_miss))
    assert not verdict.passed and verdict.blame == blame


def test_a_scenario_that_took_instances_blames_the_pool_it_took_them_from() -> None:
    verdict = PD(NODE_LOSS, EvalResult(0.5, {"ttft_misses": 9.0, "itl_misses": 0.0}))
    assert not verdict.passed and verdict.blame == "decode"
