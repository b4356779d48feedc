"""Shadow traffic against twins: a healthy candidate mirrored half the traffic behaves as the simulator
predicted for that share, and production is not slowed beyond the stated bound; a stalled candidate fails
its gates (every copy failed) while production is still unharmed and the copies past the bound are dropped."""

from __future__ import annotations

import asyncio

import pytest

from llmcap.rollout.gates import Tolerances
from llmcap.rollout.shadow import ImpactBound, run_shadow
from tests.rollout.test_rollout_twins import predictions, traffic
from tests.twin._twin import SERVED, running_twin

pytestmark = [pytest.mark.timeout(120), pytest.mark.timing]
SHARE = 0.5
TOL = Tolerances(min_requests=8, min_requests_errors=3)
BOUND = ImpactBound(rel=0.10, abs_s=0.010)


def shadow(**candidate_knobs):
    trace = traffic(8.0)
    pred = predictions(trace, (SHARE,))[SHARE]
    columns = [trace.column(c).to_numpy() for c in ("arrival_s", "isl", "osl")]

    async def scenario():
        async with running_twin() as base, running_twin(**candidate_knobs) as cand:
            return await run_shadow(
                base.url,
                cand.url,
                SERVED,
                *columns,
                SHARE,
                pred,
                TOL,
                ttft_target_s=0.5,
                bound=BOUND,
                max_in_flight=4,
                timeout_s=20.0,
                drain_s=1.0,
            )

    return asyncio.run(scenario()), trace.num_rows


def test_a_healthy_shadow_is_as_predicted_and_production_is_unharmed():
    res, n = shadow()
    assert res.production_unharmed, res.markdown()
    assert res.as_predicted, res.markdown()
    judged = {g.gate for g in res.gates if g.judged}
    assert {"ttft_p99", "itl_p99", "error_rate", "kv_usage"} <= judged
    assert res.production["without"]["ok"] == res.production["with"]["ok"] == n
    sent = res.mirror["mirrored"]
    assert 0.3 * n < sent + res.mirror["dropped"] < 0.7 * n and res.mirror["failed"] == 0
    assert res.rows["shadow"].num_rows == sent and res.rows["production_with"].num_rows == n


def test_a_stalled_shadow_fails_its_gates_but_not_production():
    res, n = shadow(stall_s=3600.0)
    assert res.production_unharmed, res.markdown()
    assert not res.as_predicted and not {g.gate: g for g in res.gates}["error_rate"].passed
    assert res.mirror["mirrored"] == 4 and res.mirror["failed"] == 4 and res.mirror["dropped"] > 0  # the bound held
    assert res.production["with"]["ok"] == n
    assert "Production unharmed: yes" in res.markdown() and "Candidate as predicted: NO" in res.markdown()
