"""The twin speaks vLLM's OpenAI-compatible dialect and always says it is a twin."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from llmcap.live.client import SSELines
from llmcap.live.metrics import parse_metrics
from tests.twin._twin import SERVED, running_twin

pytestmark = pytest.mark.timeout(60)


def test_endpoints_stream_and_errors():
    async def scenario():
        async with running_twin() as twin, httpx.AsyncClient(base_url=twin.url, timeout=10.0) as c:
            out = {
                "health": await c.get("/health"),
                "version": await c.get("/version"),
                "models": await c.get("/v1/models"),
            }
            body = {
                "model": SERVED,
                "prompt": [5, 6, 7, 8],
                "max_tokens": 3,
                "stream": True,
                "stream_options": {"include_usage": True},
                "return_token_ids": True,
            }
            out["stream"] = await c.post("/v1/completions", json=body)
            out["plain"] = await c.post(
                "/v1/completions", json={"model": SERVED, "prompt": "hello twin", "max_tokens": 4}
            )
            out["wrong_model"] = await c.post(
                "/v1/completions", json={"model": "gpt-9", "prompt": [1], "max_tokens": 1}
            )
            too_long = twin.spec.max_model_len
            out["too_long"] = await c.post("/v1/completions", json={"prompt": [1] * 10, "max_tokens": too_long})
            out["bad"] = await c.post("/v1/completions", json={"prompt": [1], "max_tokens": 0})
            out["nowhere"] = await c.get("/v1/chat/nothing")
            out["metrics"] = await c.get("/metrics")
            return out

    r = asyncio.run(scenario())
    assert r["health"].status_code == 200
    assert r["version"].json()["twin"] is True and "twin" in r["version"].json()["version"]
    assert all(resp.headers["x-llmcap-twin"].startswith("simulated") for resp in r.values())
    assert [m["id"] for m in r["models"].json()["data"]] == [SERVED]

    events = [line[6:] for line in SSELines().feed(r["stream"].content) if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    docs = [json.loads(e) for e in events[:-1]]
    tokens = [d["choices"][0] for d in docs if d["choices"]]
    assert [len(c["token_ids"]) for c in tokens] == [1, 1, 1]
    assert tokens[0]["prompt_token_ids"] == [5, 6, 7, 8]
    assert [c["finish_reason"] for c in tokens] == [None, None, "length"]
    assert docs[-1]["usage"] == {"prompt_tokens": 4, "total_tokens": 7, "completion_tokens": 3}
    assert r["stream"].headers["transfer-encoding"] == "chunked"

    plain = r["plain"].json()
    assert plain["usage"]["completion_tokens"] == 4 and plain["choices"][0]["finish_reason"] == "length"
    assert r["wrong_model"].status_code == 404
    assert r["too_long"].status_code == 400 and r["bad"].status_code == 400 and r["nowhere"].status_code == 404

    snap = parse_metrics(r["metrics"].text)
    assert snap.get("vllm:request_success_total") == 2
    assert snap.get("vllm:generation_tokens_total") == 7
    assert snap.get("vllm:prompt_tokens_total") == 4 + 3  # "hello twin": 10 bytes -> 3 stand-in ids
    assert snap.cache_config is not None and snap.cache_config.num_blocks == twin_blocks()
    assert snap.get("llmcap_twin_info") == 1
    assert 'twin="llmcap"' in r["metrics"].text.split("vllm:num_requests_running{")[1].split("}")[0]


def twin_blocks() -> int:
    from tests.twin._twin import FAST, deployment

    return deployment(*FAST)[0].engine.num_blocks
