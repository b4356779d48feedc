"""Smoke tests against a real vLLM engine on the CPU (fixture `vllm_engine`, see conftest.py).

What the planner relies on: exact input/output lengths from token-id prompts with `ignore_eos`,
token counts from the stream's token ids (an event may carry several), the KV cache config on
/metrics, and a KV capacity in the log that agrees with /metrics and with the model's shape.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmcap.live.client import SSELines
from llmcap.live.engine_kv import parse_kv_cache_log

pytestmark = pytest.mark.live

FIRST_ORDINARY_ID = 4  # ids 0-3 are <unk> <s> </s> <pad> in the tiny model's tokenizer


def token_prompt(n: int, vocab_size: int, salt: int = 0) -> list[int]:
    """n deterministic ordinary token ids."""
    span = vocab_size - FIRST_ORDINARY_ID
    return [FIRST_ORDINARY_ID + (7 * i + 13 * salt) % span for i in range(n)]


def stream_completion(engine, prompt: list[int], max_tokens: int) -> tuple[list[dict], float]:
    body = {
        "model": engine.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    events: list[dict] = []
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{engine.base_url}/v1/completions", json=body, timeout=120.0) as r:
        assert r.status_code == 200, r.read().decode(errors="replace")
        done = False
        lines = SSELines()  # not iter_lines: it also ends lines inside the generated text (U+2028, ...)
        for line in (x for chunk in r.iter_bytes() for x in lines.feed(chunk)):
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
                break
            events.append(json.loads(data))
    elapsed = time.perf_counter() - t0
    assert done, "the stream did not end with data: [DONE]"
    return events, elapsed


def model_config(engine) -> dict:
    return json.loads((engine.model_dir / "config.json").read_text())


@pytest.mark.parametrize(("n_prompt", "n_out"), [(1, 1), (100, 64), (300, 17)])
def test_streaming_completion_has_exact_token_counts(vllm_engine, n_prompt, n_out):
    vocab = model_config(vllm_engine)["vocab_size"]
    prompt = token_prompt(n_prompt, vocab, salt=n_out)
    events, elapsed = stream_completion(vllm_engine, prompt, n_out)

    token_events = [e for e in events if e.get("choices")]
    usage_events = [e for e in events if e.get("usage")]
    # Usually one event per token, but vLLM's API server merges the deltas of a request when it falls
    # behind the engine (v1 RequestOutputCollector), so an event may carry several: count token ids.
    per_event = [len(e["choices"][0]["token_ids"]) for e in token_events]
    assert min(per_event) >= 1 and sum(per_event) == n_out
    assert all(0 <= t < vocab for e in token_events for t in e["choices"][0]["token_ids"])
    assert token_events[0]["choices"][0]["prompt_token_ids"] == prompt
    assert token_events[-1]["choices"][0]["finish_reason"] == "length"
    assert all(e["choices"][0]["finish_reason"] is None for e in token_events[:-1])

    assert len(usage_events) == 1 and usage_events[0] is events[-1]
    usage = usage_events[0]["usage"]
    assert usage["prompt_tokens"] == n_prompt
    assert usage["completion_tokens"] == n_out
    assert usage["total_tokens"] == n_prompt + n_out
    print(f"\n[live] prompt {n_prompt} + {n_out} tokens in {elapsed:.3f} s = {n_out / elapsed:.1f} output tokens/s")


def test_metrics_expose_cache_config_info(vllm_engine):
    r = httpx.get(f"{vllm_engine.base_url}/metrics", timeout=30.0)
    assert r.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(r.text)}

    info = families["vllm:cache_config_info"]
    assert len(info.samples) == 1
    labels = info.samples[0].labels
    assert labels["enable_prefix_caching"] == "True"
    block_size, num_blocks = int(labels["block_size"]), int(labels["num_gpu_blocks"])
    assert block_size > 0 and num_blocks > 0
    assert (block_size, num_blocks) == (vllm_engine.kv.block_size, vllm_engine.kv.num_blocks)
    # The load-facing gauges the planner's probes read are there too.
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert name in families, name


def test_log_kv_capacity_equals_blocks_times_block_size(vllm_engine):
    from_log = parse_kv_cache_log(vllm_engine.log_text())
    assert from_log is not None
    assert from_log.device == "CPU"
    assert from_log.max_model_len == vllm_engine.kv.max_model_len
    assert from_log.kv_space_gib == vllm_engine.kv.kv_space_gib

    kv = vllm_engine.kv
    assert from_log.capacity_tokens == kv.capacity_tokens
    assert from_log.capacity_tokens == kv.num_blocks * kv.block_size
    if kv.from_metrics.size_tokens_label is not None:
        assert kv.from_metrics.size_tokens_label == from_log.capacity_tokens
    assert from_log.max_concurrency == pytest.approx(from_log.capacity_tokens / from_log.max_model_len, abs=0.01)


def test_kv_capacity_matches_the_model_shape(vllm_engine):
    """Capacity = KV space / (2 (K and V) x layers x KV heads x head dim x dtype bytes)."""
    cfg = model_config(vllm_engine)
    assert cfg["dtype"] == "bfloat16"
    layers, kv_heads = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
    bytes_per_token = 2 * layers * kv_heads * cfg["head_dim"] * 2
    kv = vllm_engine.kv
    assert kv.memory_bytes == int(kv.kv_space_gib * 2**30)
    assert kv.bytes_per_token == bytes_per_token
    expected_tokens = kv.memory_bytes // bytes_per_token // kv.block_size * kv.block_size
    assert kv.capacity_tokens == expected_tokens
