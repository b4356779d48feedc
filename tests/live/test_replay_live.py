"""Open-loop replay of a tiny 20-request trace against the real vLLM CPU engine."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from llmcap.live import replay
from llmcap.sim.records import REQUEST_SCHEMA

pytestmark = pytest.mark.live


def _trace(n: int = 20, seed: int = 7) -> pa.Table:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / 8.0, n))  # Poisson, 8 req/s: ~2.5 s of traffic
    arrivals -= arrivals[0]
    return pa.table(
        {
            "request_id": np.arange(100, 100 + n, dtype=np.int64),
            "arrival_s": arrivals,
            "isl": rng.integers(16, 600, n),
            "osl": rng.integers(1, 48, n),
        }
    )


def test_replays_a_tiny_trace_open_loop(vllm_engine):
    trace = _trace()
    result = replay(vllm_engine.base_url, vllm_engine.model, trace, rate_scale=1.0)
    t = result.requests
    assert t.schema.equals(REQUEST_SCHEMA)
    rows = t.to_pylist()
    assert [r["request_id"] for r in rows] == trace.column("request_id").to_pylist()
    assert [r["status"] for r in rows] == ["ok"] * 20
    assert [r["isl"] for r in rows] == trace.column("isl").to_pylist()  # exact prompt lengths
    assert [r["osl"] for r in rows] == trace.column("osl").to_pylist()  # exact output lengths

    # open loop: each request left at its arrival time, whatever the server was doing
    scheduled = trace.column("arrival_s").to_numpy()
    # (late only by the client's own event loop on this shared 2-core box; tens of ms at worst)
    assert (result.lateness_s >= 0).all() and result.lateness_s.max() < 0.25, result.lateness_s
    arrival = np.array([r["arrival_s"] for r in rows])
    assert np.allclose(arrival, scheduled + result.lateness_s)
    for r in rows:
        assert 0 < r["ttft_s"] <= r["e2e_s"]
        assert r["first_token_s"] == pytest.approx(r["arrival_s"] + r["ttft_s"])
        assert r["finish_s"] == pytest.approx(r["arrival_s"] + r["e2e_s"])
        assert r["decode_s"] == pytest.approx(r["finish_s"] - r["first_token_s"])
        if r["osl"] > 1:
            assert r["tpot_s"] == pytest.approx(r["decode_s"] / (r["osl"] - 1))
            assert 0 <= r["itl_p50_s"] <= r["itl_p99_s"] <= r["itl_max_s"]
        else:
            assert r["tpot_s"] is None and r["itl_max_s"] is None
        # what a client cannot see is null (or 0 where the schema has no nulls)
        assert r["admitted_s"] is None and r["queue_s"] is None and r["prefill_replica"] is None
        assert (r["cached_tokens"], r["preemptions"]) == (0, 0)
    # every gap of every request is in the all-token list
    assert result.itls.size == sum(r["osl"] - 1 for r in rows)
    assert result.itls.sum() == pytest.approx(sum(r["decode_s"] for r in rows))
    print(
        f"\n[live] replay: 20 requests in {result.wall_s:.2f} s, TTFT p50 "
        f"{np.median([r['ttft_s'] for r in rows]) * 1e3:.1f} ms, ITL p50 {np.median(result.itls) * 1e3:.2f} ms, "
        f"max lateness {result.lateness_s.max() * 1e3:.1f} ms"
    )


def test_rate_scaling_compresses_arrivals(vllm_engine):
    trace = _trace(n=6, seed=3)
    result = replay(vllm_engine.base_url, vllm_engine.model, trace, rate_scale=4.0)
    arrival = np.array(result.requests.column("arrival_s").to_pylist())
    assert np.allclose(arrival, trace.column("arrival_s").to_numpy() / 4.0 + result.lateness_s)
    assert result.lateness_s.max() < 0.25
    assert result.requests.column("status").to_pylist() == ["ok"] * 6


def test_an_impossible_request_is_rejected_not_fatal(vllm_engine):
    trace = pa.table({"arrival_s": [0.0, 0.01], "isl": [vllm_engine.kv.max_model_len + 10, 32], "osl": [4, 4]})
    result = replay(vllm_engine.base_url, vllm_engine.model, trace)
    assert result.requests.column("status").to_pylist() == ["rejected", "ok"]
    first = result.requests.to_pylist()[0]
    assert first["ttft_s"] is None and first["osl"] == 0
