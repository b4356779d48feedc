"""Gradual traffic against twins: the baseline and the candidate are twins of the same deployment
(a healthy candidate behaves as predicted and goes to 100%) or the candidate is slowed down (it
breaches the latency gate at the first step, and the weight is back at 0 within one interval).
The open-loop replay drives the gateway the whole time; every request of it has exactly one row."""

from __future__ import annotations

import asyncio

import numpy as np
import pyarrow as pa
import pytest

from llmcap.gateway import Gateway, GatewayConfig
from llmcap.live.trace_replay import replay_async
from llmcap.rollout.driver import RolloutPlan, run_rollout
from llmcap.rollout.gates import Tolerances
from llmcap.rollout.observe import ScrapeSource
from llmcap.rollout.predict import predict_share
from tests.gateway._gateway import columns, running_gateway
from tests.twin._twin import FAST, SERVED, deployment, running_twin

pytestmark = [pytest.mark.timeout(120), pytest.mark.timing]

RATE, ISL, OSL = 16.0, 200, 24
PLAN = RolloutPlan(steps=(0.25, 0.5, 1.0), hold_s=3.0, interval_s=0.5, ttft_target_s=0.5)
TOL = Tolerances(min_requests=8, min_requests_errors=3)


class LocalWeights:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    async def set(self, weight: float) -> None:
        self.gw.set_weight(weight)


def traffic(seconds: float) -> pa.Table:
    n = int(RATE * seconds)
    return pa.table(
        {"request_id": np.arange(n), "arrival_s": np.arange(n) / RATE, "isl": np.full(n, ISL), "osl": np.full(n, OSL)}
    )


def predictions(trace: pa.Table, steps: tuple[float, ...] = PLAN.steps) -> dict:
    cfg, step = deployment(*FAST)
    return {w: predict_share(trace, cfg, step, w, seed=7) for w in steps}


def rollout(candidate_knobs: dict):
    trace = traffic(PLAN.hold_s * len(PLAN.steps) + 3.0)
    preds = predictions(trace)

    async def scenario():
        async with (
            running_twin() as base,
            running_twin(**candidate_knobs) as cand,
            running_gateway(GatewayConfig(baseline=base.url, candidate=cand.url)) as gw,
        ):
            source = ScrapeSource(gw.url, cand.url)
            load = asyncio.create_task(
                replay_async(
                    gw.url,
                    SERVED,
                    trace.column("arrival_s").to_numpy(),
                    trace.column("isl").to_numpy(),
                    trace.column("osl").to_numpy(),
                    timeout_s=20.0,
                )
            )
            outcome = await run_rollout(PLAN, LocalWeights(gw), source, preds, TOL)
            replayed = await asyncio.wait_for(load, 60)
            await source.aclose()
            await gw.settle()
            return outcome, replayed, gw.table(), list(gw.weight_log)

    return asyncio.run(scenario())


def test_a_candidate_that_behaves_as_predicted_goes_to_all_traffic():
    outcome, replayed, table, log = rollout({})
    assert outcome.status == "completed", outcome.reason
    assert [s.weight for s in outcome.steps] == [0.25, 0.5, 1.0]
    judged = [g for s in outcome.steps for g in s.evaluations[-1].gates if g.judged]
    assert {"ttft_p99", "itl_p99", "attainment", "error_rate", "kv_usage"} <= {g.gate for g in judged}
    g, r = columns(table), columns(replayed.requests)
    assert sorted(g["request_id"]) == sorted(r["request_id"]) == list(range(len(r["request_id"])))
    assert (g["status"] == "ok").all() and (g["side"] == "candidate").sum() > len(g["side"]) / 2
    assert [w for _, w in log] == [0.0, 0.25, 0.5, 1.0]


def test_a_slowed_candidate_is_rolled_back_at_its_first_step_within_one_interval():
    outcome, replayed, table, log = rollout({"slowdown": 6.0})
    assert outcome.status == "rolled_back" and len(outcome.steps) == 1, outcome.reason
    gates = {b.gate for b in outcome.breaches}
    assert gates & {"ttft_p99", "itl_p99", "attainment"}, outcome.reason
    last = outcome.steps[0].evaluations
    assert outcome.rolled_back_s - last[-1].at_s < PLAN.interval_s  # acted on in the evaluation that saw it
    assert all(not e.breaches for e in last[:-1])
    assert [w for _, w in log] == [0.0, 0.25, 0.0]
    g, r = columns(table), columns(replayed.requests)
    assert sorted(g["request_id"]) == list(range(len(r["request_id"])))  # none lost
    assert (g["status"] == "ok").all()
