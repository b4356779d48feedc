"""Histograms read as PromQL reads them, and the gates' verdicts on made-up windows."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.gateway.metrics import GatewayMetrics
from llmcap.rollout.gates import ITL_BOUNDS, TTFT_BOUNDS, Prediction, Tolerances, evaluate
from llmcap.rollout.histogram import Buckets, histogram, of_values
from llmcap.rollout.observe import Observation

BOUNDS = np.array([0.1, 0.25, 0.5, 1.0, np.inf])


def test_quantiles_interpolate_within_the_bucket_as_histogram_quantile_does():
    h = of_values(np.array([0.05, 0.2, 0.2, 0.3, 0.9, 2.0]), BOUNDS)
    assert h.counts.tolist() == [1, 3, 4, 5, 6]
    assert h.quantile(0.5) == pytest.approx(0.25)  # rank 3: the top of (0.1, 0.25]
    assert h.quantile(0.25) == pytest.approx(0.1 + 0.15 * 0.25)  # rank 1.5: a quarter into (0.1, 0.25]
    assert h.quantile(0.99) == 1.0  # in the +Inf bucket: the largest finite bound
    assert h.fraction_at_most(0.25) == pytest.approx(0.5) and h.fraction_at_most(0.375) == pytest.approx(
        3.5 / 6
    )  # half of (0.25, 0.5]
    assert Buckets(BOUNDS, np.zeros(5)).quantile(0.5) is None


def test_a_window_is_the_difference_of_two_scrapes_and_a_reset_starts_over():
    m = GatewayMetrics()
    for v in (0.05, 0.2):
        m.ttft.labels("candidate").observe(v)
    m.ttft.labels("baseline").observe(9.0)
    before = histogram(m.render().decode(), "llmcap_gateway_time_to_first_token_seconds", {"side": "candidate"})
    for v in (0.3, 0.3, 0.3):
        m.ttft.labels("candidate").observe(v)
    after = histogram(m.render().decode(), "llmcap_gateway_time_to_first_token_seconds", {"side": "candidate"})
    window = after.minus(before)
    assert window.total == 3 and window.quantile(0.5) == pytest.approx(0.25 + 0.25 * 0.5)
    assert before.minus(after).total == before.total  # counts went down: a restart, read from zero


def prediction(ttft=0.1, itl=0.02, n=200) -> Prediction:
    return Prediction.from_values(0.25, np.full(n, ttft), np.full(n, itl), np.ones(n), 0.3, 2.0, 0)


def observation(ttft=0.1, itl=0.02, n=200, errors=0, kv=0.3, waiting=2.0, preempt=0.0) -> Observation:
    return Observation(
        0.0,
        10.0,
        n,
        errors,
        of_values(np.full(n, ttft), TTFT_BOUNDS),
        of_values(np.full(n, itl), ITL_BOUNDS),
        kv,
        waiting,
        preempt,
    )


def verdicts(obs, pred=None, tol=Tolerances()):
    return {g.gate: g for g in evaluate(obs, pred or prediction(), tol, ttft_target_s=0.5)}


def test_as_predicted_passes_every_gate():
    v = verdicts(observation())
    assert all(g.passed and g.judged for g in v.values()), [g.describe() for g in v.values()]


@pytest.mark.parametrize(
    ("obs", "gate"),
    [
        (observation(ttft=0.4), "ttft_p99"),
        (observation(itl=0.2), "itl_p99"),
        (observation(ttft=0.9), "attainment"),
        (observation(errors=10), "error_rate"),
        (observation(kv=0.9), "kv_usage"),
        (observation(waiting=40), "waiting"),
        (observation(preempt=50), "preemptions"),
    ],
)
def test_each_gate_breaches_on_its_own_signal(obs, gate):
    v = verdicts(obs)
    assert not v[gate].passed and v[gate].excess > 0 and "BREACH" in v[gate].describe()


def test_too_few_requests_are_not_judged_and_never_pass_as_judged():
    v = verdicts(observation(ttft=5.0, n=5))
    assert not v["ttft_p99"].judged and v["ttft_p99"].passed and "not judged" in v["ttft_p99"].describe()
    assert v["error_rate"].judged  # errors are judged from 5 requests
