"""The planner's KV capacity equals what a real vLLM engine reports (issue 3 acceptance).

The engine (fixture `vllm_engine`) serves the tiny random Llama with a fixed KV space
(VLLM_CPU_KVCACHE_SPACE GiB). `llmcap.memory.vllm_kv_capacity_tokens` predicts its capacity from
nothing but the model's config.json (parsed by `llmcap.catalog.load_model`), the KV dtype, the KV
bytes we gave it and its block size; the prediction must equal, to the token, the capacity in its
startup log and in `/metrics` `vllm:cache_config_info`.
"""

from __future__ import annotations

import re

import pytest

from llmcap.catalog import load_model
from llmcap.live.engine_kv import parse_cache_config_info, parse_kv_cache_log
from llmcap.memory import kv_bytes_per_token_per_rank, vllm_kv_capacity_tokens
from llmcap.parallelism import Parallelism

pytestmark = pytest.mark.live


def _recorded_lines(engine) -> tuple[str, str]:
    """The log line and the metrics line the engine printed (shown with -s, kept in the report)."""
    log_line = next(ln for ln in reversed(engine.log_text().splitlines()) if "KV cache size:" in ln)
    metrics_line = next(ln for ln in engine.metrics_text().splitlines() if ln.startswith("vllm:cache_config_info{"))
    return log_line, metrics_line


def test_model_config_parses_through_the_catalog(vllm_engine):
    model = load_model(vllm_engine.model_dir)  # a directory holding config.json
    assert model.name == vllm_engine.model_dir.name
    assert (model.num_layers, model.num_kv_heads, model.head_dim, model.attention_kind) == (4, 2, 64, "gqa")
    assert model.dtype == "bfloat16"
    assert model.kv_bytes_per_token(2) == 2 * 4 * 2 * 64 * 2  # K and V x layers x KV heads x head dim x bf16
    assert load_model(vllm_engine.model_dir / "config.json").kv_bytes_per_token(2) == model.kv_bytes_per_token(2)


def test_predicted_capacity_equals_the_engine_log_and_metrics(vllm_engine):
    kv = vllm_engine.kv
    model = load_model(vllm_engine.model_dir)
    kv_bytes = int(kv.kv_space_gib * 2**30)  # what we gave the engine (VLLM_CPU_KVCACHE_SPACE)
    predicted = vllm_kv_capacity_tokens(model, kv_bytes, kv.block_size, kv_dtype="bf16")

    log_line, metrics_line = _recorded_lines(vllm_engine)
    print(
        f"\n[live] log:     {log_line}\n[live] metrics: {metrics_line}\n[live] predicted {predicted:,} tokens "
        f"({kv_bytes:,} B / {kv_bytes_per_token_per_rank(model, Parallelism()):,.0f} B/token, block {kv.block_size})"
    )

    from_log = parse_kv_cache_log(vllm_engine.log_text())
    from_metrics = parse_cache_config_info(vllm_engine.metrics_text())
    assert from_log is not None and from_metrics is not None
    assert predicted == from_log.capacity_tokens  # "CPU KV cache size: N tokens"
    assert predicted == from_metrics.num_blocks * from_metrics.block_size  # cache_config_info
    assert predicted // kv.block_size == from_metrics.num_blocks
    if from_metrics.size_tokens_label is not None:
        assert predicted == from_metrics.size_tokens_label
    if from_metrics.memory_bytes is not None:  # the engine's own byte count agrees with what we set
        assert from_metrics.memory_bytes == kv_bytes
        assert vllm_kv_capacity_tokens(model, from_metrics.memory_bytes, from_metrics.block_size) == predicted
    # "Maximum concurrency for L tokens per request: C x" = capacity / L
    assert from_log.max_model_len is not None and from_log.max_concurrency is not None
    assert from_log.max_concurrency == pytest.approx(predicted / from_log.max_model_len, abs=0.005)


def test_the_log_line_has_the_expected_shape(vllm_engine):
    log_line, _ = _recorded_lines(vllm_engine)
    assert re.search(r"CPU KV cache size: [\d,]+ tokens, Maximum concurrency for [\d,]+ tokens per request", log_line)
