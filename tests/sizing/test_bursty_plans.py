"""Plans on traffic the sizer was never tuned on: bursty Markov-modulated arrivals (1-second peaks ≥ 20× the mean,
inter-arrival CV ≥ 10) under the Azure conversation lengths, and the Mooncake conversation trace.

For each, the plan is checked by simulating its recorded deployment again, outside the sizer
(`llmcap.sizing.planned`): every scenario passes at the plan's counts, the scenario that one instance fewer fails
(per pool) fails again, and no listed shape that passes costs less than the chosen one."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.candidates import EnumerationSpec, enumerate_candidates
from llmcap.catalog import load_model
from llmcap.sizing.params import SearchParams, SizeParams, SloParams
from llmcap.sizing.plan import size_deployments
from llmcap.sizing.planned import PlannedDeployment
from llmcap.trace import ingest
from llmcap.trace.params import ArrivalSpec
from llmcap.trace.stats import window_counts
from llmcap.trace.synth import synthesize
from tests.conftest import TRACES

MODEL = load_model("Llama-3.1-70B")
PARAMS = SizeParams(
    slo=SloParams(
        ttft_ms=2000, ttft_ms_per_1k_isl=200, itl_ms=100, attainment_target=0.99, warmup_frac=0.1, drain_frac=0.1
    ),
    search=SearchParams(seeds=(0, 1), rel_tol=0.05),
    excerpt_requests=1000,
    count_seeds=(),
)
REQUESTS = 3000


def _bursty(seed: int):
    source = ingest(TRACES["azure_conv"]).trace
    return synthesize(
        source,
        REQUESTS,
        ArrivalSpec(process="mmpp", rate_rps=2.6, burst_share=0.02, burst_s=2.0, seed=seed),
        np.random.default_rng(seed),
    )


TRACE_MAKERS = {
    "mmpp-0": lambda: _bursty(0),
    "mmpp-1": lambda: _bursty(1),
    "mooncake": lambda: ingest(TRACES["mooncake_conversation"]).trace.slice(0, REQUESTS),
}


@pytest.fixture(scope="module")
def candidates():
    spec = EnumerationSpec(
        gpus=["h100"], weight_quants=["fp8"], kv_dtypes=["fp8"], parallel={"tp": [2, 4]}, max_context_len=131072
    )
    return enumerate_candidates(MODEL, spec).table


@pytest.fixture(scope="module", params=sorted(TRACE_MAKERS))
def sized(request, candidates):
    trace = TRACE_MAKERS[request.param]()
    return request.param, trace, size_deployments(trace, candidates, MODEL, PARAMS)


def test_the_synthetic_traces_are_as_bursty_as_asked():
    for seed in (0, 1):
        t = np.sort(_bursty(seed).column("arrival_s").to_numpy())
        gaps = np.diff(t)
        per_second = window_counts(t, 1.0)
        assert per_second.max() >= 20 * REQUESTS / (t[-1] - t[0])  # a 1-second peak ≥ 20× the mean rate
        assert gaps.std() / gaps.mean() >= 10


def test_every_scenario_of_the_plan_passes_when_simulated_again_outside_the_sizer(sized):
    name, trace, outcome = sized
    s = outcome.summary
    assert s["verdict"] == "passes" and s["scenarios_pass"], name
    planned = PlannedDeployment.from_dict(s["deployment"])
    assert (
        planned.model == "Llama-3.1-70B"
    )  # the catalog's name, not this checkout's path: summary.json reproduces anywhere
    assert planned.counts == {pool: q["instances"] for pool, q in s["pool_plans"].items()}
    for scenario, counts in planned.scenarios.items():
        check = planned.judge(planned.replay(trace, counts))
        assert check.passes, f"{name}: {scenario} {counts}: {check.line()}"


def test_one_instance_fewer_fails_again_outside_the_sizer(sized):
    name, trace, outcome = sized
    planned = PlannedDeployment.from_dict(outcome.summary["deployment"])
    fit = outcome.evidence.fit
    assert fit is not None and fit.minimality
    for m in fit.minimality:
        if m.failed is None:  # a pool at 1 instance: one fewer serves nothing
            assert m.instances == 0
            continue
        counts = m.failed.scenario.counts()
        assert counts[m.pool] < planned.counts[m.pool]
        if min(counts.values()) < 1:
            continue  # nothing left serving in that pool: it fails by construction
        check = planned.judge(planned.replay(trace, counts))
        kv_bound = m.failed.kv_p99_share is not None and m.failed.kv_p99_share > PARAMS.headroom.kv_safe_fraction
        assert not check.passes or kv_bound or m.failed.overload, (
            f"{name}: {m.pool} at {m.instances}: {m.failed.describe()} vs {check.line()}"
        )


def test_no_listed_shape_that_passes_costs_less_than_the_chosen_one(sized):
    name, _, outcome = sized
    s = outcome.summary
    finalists = s["finalists"] or []
    assert finalists and any(f["candidate"] == s["chosen"] for f in finalists)
    assert all(f["usd_per_hour"] >= s["usd_per_hour"] for f in finalists if f["passes"]), name
    rows = outcome.table.to_pylist()
    passing = [r for r in rows if r["scenarios"] == "pass"]
    assert passing and all(r["usd_per_hour"] >= s["usd_per_hour"] - 1e-9 for r in passing), name


def test_a_plan_checked_on_the_busiest_span_holds_on_the_whole_trace(candidates):
    """A trace longer than `whole_trace_max_requests` is checked on its busiest period only (a third of this one); the
    plan that comes out passes every scenario when its deployment replays the whole trace, outside the sizer."""
    trace = _bursty(0)
    params = PARAMS.model_copy(update={"whole_trace_max_requests": REQUESTS // 3})
    s = size_deployments(trace, candidates, MODEL, params).summary
    assert s["verdict"] == "passes" and s["checked_traffic"].startswith("the busiest span of the trace: requests ")
    planned = PlannedDeployment.from_dict(s["deployment"])
    for scenario, counts in planned.scenarios.items():
        check = planned.judge(planned.replay(trace, counts))
        assert check.passes, f"{scenario} {counts}: {check.line()}"
