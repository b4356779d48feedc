"""The gateway in front of two twins, with the open-loop replay as its client: split by weight, every
request one row, failures on the candidate retried or counted, weights changed while it runs, a
stalled shadow that production does not feel."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

from llmcap.gateway import GatewayConfig, ShadowTarget
from llmcap.live.metrics import parse_metrics
from llmcap.live.trace_replay import replay_async
from tests.gateway._gateway import columns, running_gateway
from tests.twin._twin import SERVED, running_twin

pytestmark = [pytest.mark.timeout(90), pytest.mark.timing]
BOUND_S = 30.0


def schedule(n: int, gap_s: float = 0.03, isl: int = 120, osl: int = 12):
    return np.arange(n) * gap_s, np.full(n, isl), np.full(n, osl)


async def success(url: str) -> float:
    async with httpx.AsyncClient() as c:
        return parse_metrics((await c.get(f"{url}/metrics")).text).get("vllm:request_success_total") or 0.0


def test_a_split_serves_each_request_once_on_the_side_its_key_chose(tmp_path):
    n = 60
    arrival, isl, osl = schedule(n)

    async def scenario():
        async with running_twin() as base, running_twin() as cand:
            cfg = GatewayConfig(baseline=base.url, candidate=cand.url, candidate_weight=0.5)
            async with running_gateway(cfg, record=tmp_path / "rows.jsonl") as gw:
                res = await asyncio.wait_for(
                    replay_async(gw.url, SERVED, arrival, isl, osl, request_id=np.arange(100, 100 + n)), BOUND_S
                )
                async with httpx.AsyncClient() as c:
                    metrics = parse_metrics((await c.get(f"{gw.url}/metrics")).text)
                await gw.settle()
                return res, gw.table(), await success(base.url), await success(cand.url), metrics

    res, table, on_base, on_cand, metrics = asyncio.run(scenario())
    g, r = columns(table), columns(res.requests)
    assert sorted(g["request_id"]) == list(range(100, 100 + n))  # the replay's ids, through X-Request-Id
    assert (g["status"] == "ok").all() and (g["osl"] == 12).all() and (r["status"] == "ok").all()
    assert (g["side"] == g["routed"]).all() and not g["retried"].any()
    assert on_cand == (g["side"] == "candidate").sum() and on_base == (g["side"] == "baseline").sum()
    assert 0.25 < on_cand / n < 0.75
    assert metrics.get("llmcap_gateway_requests_total") == n
    recorded = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert sorted(x["request_id"] for x in recorded) == sorted(g["request_id"].tolist())
    # the gateway's TTFT is the client's, less the client-side overhead: never more than the replay saw
    by_id = dict(zip(r["request_id"].tolist(), r["ttft_s"].tolist(), strict=True))
    assert all(t <= by_id[i] + 0.005 for i, t in zip(g["request_id"].tolist(), g["ttft_s"].tolist(), strict=True))


def test_candidate_errors_before_the_first_byte_are_retried_on_the_baseline():
    n = 40
    arrival, isl, osl = schedule(n)

    async def scenario():
        async with (
            running_twin() as base,
            running_twin(error_rate=1.0) as cand,
            running_gateway(GatewayConfig(baseline=base.url, candidate=cand.url, candidate_weight=0.5)) as gw,
        ):
            res = await asyncio.wait_for(replay_async(gw.url, SERVED, arrival, isl, osl), BOUND_S)
            await gw.settle()
            return res, gw.table(), cand.faults.errors

    res, table, errors = asyncio.run(scenario())
    g = columns(table)
    routed = g["routed"] == "candidate"
    assert routed.sum() == errors > 0
    assert (g["retried"] == routed).all() and (g["side"] == "baseline").all()
    assert (g["status"] == "ok").all() and (columns(res.requests)["status"] == "ok").all()


def test_a_candidate_crash_mid_rollout_loses_no_request():
    n, out = 40, 120
    arrival, isl, osl = schedule(n, gap_s=0.05, osl=out)

    async def scenario():
        async with (
            running_twin() as base,
            running_twin(crash_after=6) as cand,
            running_gateway(GatewayConfig(baseline=base.url, candidate=cand.url, candidate_weight=0.5)) as gw,
        ):
            res = await asyncio.wait_for(replay_async(gw.url, SERVED, arrival, isl, osl, timeout_s=10.0), BOUND_S)
            await gw.settle()
            return res, gw.table(), cand.crashed

    res, table, crashed = asyncio.run(scenario())
    g, r = columns(table), columns(res.requests)
    assert crashed and len(g["seq"]) == n and sorted(g["request_id"]) == list(range(n))
    cut = g["outcome"] == "failed_midstream"
    assert cut.sum() >= 1 and (g["side"][cut] == "candidate").all()  # streams in flight on the candidate
    assert g["retried"].sum() >= 1  # arrivals after the crash went to the baseline
    assert (g["status"][~cut] == "ok").all()
    # the client saw exactly what the gateway recorded: the cut ones broke, the rest finished
    client = dict(zip(r["request_id"].tolist(), r["status"].tolist(), strict=True))
    assert all(client[i] == s for i, s in zip(g["request_id"].tolist(), g["status"].tolist(), strict=True))


def test_weights_change_at_run_time_through_the_loopback_admin_api():
    async def scenario():
        async with (
            running_twin() as base,
            running_twin() as cand,
            running_gateway(GatewayConfig(baseline=base.url, candidate=cand.url)) as gw,
            httpx.AsyncClient() as c,
        ):
            first = await replay_async(gw.url, SERVED, *schedule(20))
            set_half = (await c.post(f"{gw.url}/admin/weights", json={"candidate": 1.0})).json()
            second = await replay_async(gw.url, SERVED, *schedule(20))
            bad = await c.post(f"{gw.url}/admin/weights", json={"candidate": 2})
            back = (await c.post(f"{gw.url}/admin/weights", json={"candidate": 0})).json()
            await gw.settle()
            return first, second, set_half, bad.status_code, back, gw.table(), gw.weight_log

    first, second, state, bad, back, table, log = asyncio.run(scenario())
    g = columns(table)
    assert (g["side"][:20] == "baseline").all() and (g["side"][20:] == "candidate").all()
    assert state["candidate"] == 1.0 and back["candidate"] == 0.0 and bad == 400
    assert [w for _, w in log] == [0.0, 1.0, 0.0]


def test_a_request_the_gateway_cannot_read_is_refused_and_still_recorded():
    async def scenario():
        async with (
            running_twin() as base,
            running_gateway(GatewayConfig(baseline=base.url)) as gw,
            httpx.AsyncClient() as c,
        ):
            r = await c.post(f"{gw.url}/v1/completions", content=b"{not json", headers={"x-request-id": "77"})
            await gw.settle()
            return r.status_code, r.json(), gw.table()

    status, doc, table = asyncio.run(scenario())
    g = columns(table)
    assert status == 400 and "JSON" in doc["error"]["message"]
    assert g["request_id"].tolist() == [77] and g["outcome"].tolist() == ["rejected"] and g["side"].tolist() == [None]


def test_a_request_open_when_the_gateway_stops_is_recorded_as_cut():
    """An upstream that accepts and never answers: stopping the gateway still leaves the request one row."""

    answered = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        await answered.wait()
        writer.close()

    async def scenario():
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        upstream = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with running_gateway(GatewayConfig(baseline=upstream)) as gw, httpx.AsyncClient() as c:
            pending = asyncio.create_task(
                c.post(f"{gw.url}/v1/completions", json={"prompt": "x", "max_tokens": 4}, headers={"x-request-id": "5"})
            )
            while not gw.requests_open:
                await asyncio.sleep(0.01)
            await gw.stop(grace_s=0.2)
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
            table = gw.table()
        answered.set()
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.05)  # the handler closes its connection
        return table

    g = columns(asyncio.run(scenario()))
    assert (
        g["request_id"].tolist() == [5]
        and g["outcome"].tolist() == ["failed_midstream"]
        and g["error"].tolist() == ["gateway: stopped"]
    )


def test_a_stalled_shadow_does_not_slow_production():
    """Production TTFT with every request mirrored to a shadow that produces nothing is within a
    bound of production TTFT without a shadow; the copies past the shadow's bound are dropped."""
    n = 40
    arrival, isl, osl = schedule(n, gap_s=0.04)
    bound_s = 0.010  # p50 TTFT: an event loop shared with the mirror's reads costs at most this

    async def run(shadow: bool):
        async with running_twin() as base, running_twin(stall_s=3600.0) as stalled:
            shadows = (
                (ShadowTarget("stalled", stalled.url, share=1.0, max_in_flight=8, timeout_s=60.0),) if shadow else ()
            )
            async with running_gateway(GatewayConfig(baseline=base.url, shadows=shadows)) as gw:
                res = await asyncio.wait_for(replay_async(gw.url, SERVED, arrival, isl, osl), BOUND_S)
                return res, gw

    plain, _ = asyncio.run(run(False))
    mirrored, gw = asyncio.run(run(True))
    p, m = columns(plain.requests), columns(mirrored.requests)
    assert (m["status"] == "ok").all() and (p["status"] == "ok").all()
    assert np.median(m["ttft_s"]) <= np.median(p["ttft_s"]) + bound_s
    dropped = gw.metrics.mirror_dropped.labels("stalled")._value.get()
    assert dropped == n - 8  # the bound held: 8 copies waited on the stalled shadow, the rest were dropped
    assert len(gw.shadow_rows) == 8 and all(row["outcome"] != "ok" for row in gw.shadow_rows)  # cut at stop, counted
