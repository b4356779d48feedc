"""Faults against the twin, with the open-loop replay as the client: injected 500s, read timeouts
during a stall, a crash mid-stream. Every request gets a row, the misses are counted, nothing hangs
(each scenario is bounded by asyncio.wait_for and the replay's per-read timeout)."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

from llmcap.live.client import async_client, stream_completion, token_prompt
from llmcap.live.metrics import parse_metrics
from llmcap.live.trace_replay import replay_async
from tests.twin._twin import SERVED, running_twin

pytestmark = [pytest.mark.timeout(60), pytest.mark.timing]
BOUND_S = 20.0  # no scenario needs more; wait_for turns a hang into a failure


def rows(result) -> dict:
    t = result.requests.to_pydict()
    return {k: np.asarray(v) for k, v in t.items()}


def test_injected_errors_are_rejected_rows_and_counted():
    n = 24
    arrival, isl, osl = np.arange(n) * 0.04, np.full(n, 200), np.full(n, 12)

    async def scenario():
        async with running_twin(error_rate=0.3, seed=3) as twin:
            res = await asyncio.wait_for(replay_async(twin.url, SERVED, arrival, isl, osl, timeout_s=10.0), BOUND_S)
            async with httpx.AsyncClient() as c:
                metrics = parse_metrics((await c.get(f"{twin.url}/metrics")).text)
            return res, twin.faults.errors, metrics

    res, errors, metrics = asyncio.run(scenario())
    r = rows(res)
    assert sorted(r["request_id"]) == list(range(n))
    rejected = r["status"] == "rejected"
    assert 0 < errors < n and rejected.sum() == errors
    assert (r["status"][~rejected] == "ok").all() and (r["osl"][~rejected] == 12).all()
    assert metrics.get("llmcap_twin_injected_errors_total") == errors
    assert metrics.get("vllm:request_success_total") == n - errors
    assert metrics.get("vllm:generation_tokens_total") == 12 * (n - errors)


def test_a_stall_times_reads_out_and_the_twin_serves_again_after_it():
    n = 12
    arrival, isl, osl = np.arange(n) * 0.1, np.full(n, 100), np.full(n, 40)

    async def scenario():
        async with running_twin(stall_s=2.0, stall_at=0.5) as twin:
            t0 = time.perf_counter()
            res = await asyncio.wait_for(replay_async(twin.url, SERVED, arrival, isl, osl, timeout_s=0.6), BOUND_S)
            replay_wall = time.perf_counter() - t0
            await asyncio.sleep(max(0.0, 2.6 - twin.clock.tau()))  # past the stall
            async with async_client() as c:
                after = await stream_completion(c, twin.url, SERVED, token_prompt(50, 1000, 1), 5, timeout_s=5.0)
            return res, replay_wall, after

    res, replay_wall, after = asyncio.run(scenario())
    r = rows(res)
    assert sorted(r["request_id"]) == list(range(n))
    ok, unfinished = r["status"] == "ok", r["status"] == "unfinished"
    assert ok.sum() >= 1 and unfinished.sum() >= 1 and (ok | unfinished).all()
    assert (r["osl"][unfinished] < 40).all()
    assert replay_wall < 2.5  # the timeouts ended the replay, not the stall's end
    assert after.status == "ok" and after.tokens == 5


def test_a_crash_cuts_streams_mid_way_and_refuses_what_comes_after():
    n, out = 10, 300
    arrival, isl, osl = np.arange(n) * 0.05, np.full(n, 100), np.full(n, out)

    async def scenario():
        async with running_twin(crash_after=5) as twin:
            t0 = time.perf_counter()
            res = await asyncio.wait_for(replay_async(twin.url, SERVED, arrival, isl, osl, timeout_s=10.0), BOUND_S)
            wall = time.perf_counter() - t0
            async with httpx.AsyncClient() as c:
                with pytest.raises(httpx.ConnectError):
                    await c.get(f"{twin.url}/health")
            return res, wall, twin.crashed, twin.faults.requests

    res, wall, crashed, seen = asyncio.run(scenario())
    r = rows(res)
    assert crashed and seen == 6  # the sixth request killed it
    assert sorted(r["request_id"]) == list(range(n))
    assert (r["status"] == "unfinished").all()  # nothing could finish 300 tokens before the crash
    assert ((r["osl"] > 0) & (r["osl"] < out)).sum() >= 3  # streams cut mid-way
    assert wall < 5.0


def test_slowdown_at_runtime_and_dilation_scale_token_gaps():
    """Alone on the twin, a request's gaps are its decode steps: x dilation in wall time, and x the
    slowdown set through POST /admin/faults."""
    dilation = 4.0

    async def one(c, url, seed):
        r = await stream_completion(c, url, SERVED, token_prompt(64, 1000, seed), 30, timeout_s=10.0)
        assert r.status == "ok" and r.tokens == 30
        return float(np.median(r.itls()))

    async def scenario():
        async with running_twin(dilation=dilation) as twin, async_client() as c:
            before = await one(c, twin.url, 1)
            knobs = (await c.post(f"{twin.url}/admin/faults", json={"slowdown": 3.0})).json()
            after = await one(c, twin.url, 2)
            metrics = parse_metrics((await c.get(f"{twin.url}/metrics")).text)
            bad = await c.post(f"{twin.url}/admin/faults", json={"slowdown": -1})
            return before, after, knobs, metrics, bad.status_code

    before, after, knobs, metrics, bad = asyncio.run(scenario())
    from llmcap.sim.steptime import StepTimer
    from tests.twin._twin import FAST, deployment

    cfg, step = deployment(*FAST)
    step_s = StepTimer(step).one(0.0, 0.0, 0.0, 1.0, 64.0 + 15.0, 0.0)  # a decode step alone, mid-way context
    assert before / dilation == pytest.approx(step_s, rel=0.05)
    assert after / before == pytest.approx(3.0, rel=0.05)
    assert knobs["slowdown"] == 3.0 and metrics.get("llmcap_twin_slowdown") == 3.0
    assert bad == 400
