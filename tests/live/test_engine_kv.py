"""Unit tests of the engine log and /metrics parsers (no engine needed)."""

from __future__ import annotations

from llmcap.live.engine_kv import parse_cache_config_info, parse_kv_cache_log

CPU_LOG = """\
(EngineCore pid=4927) INFO 11-30 04:38:49 [core.py:133] Initializing a V1 LLM engine (v0.32.0)
(Worker pid=4960) INFO 11-30 04:39:43 [cpu_worker.py:260] Explicitly set (1.0/7.71) GiB for KV cache on node 0.
(EngineCore pid=4927) INFO 11-30 04:39:43 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, Maximum concurrency for 4,096 tokens per request: 128.00x
"""


def test_parses_the_cpu_capacity_line():
    info = parse_kv_cache_log(CPU_LOG)
    assert info is not None
    assert (info.device, info.capacity_tokens) == ("CPU", 524_288)
    assert (info.max_model_len, info.max_concurrency, info.kv_space_gib) == (4096, 128.0, 1.0)


def test_parses_a_gpu_line_with_colours_and_takes_the_last():
    log = (
        "INFO [kv_cache_utils.py:1087] \x1b[1;36mGPU KV cache size: 1,000 tokens\x1b[0m\n"
        "INFO [kv_cache_utils.py:1087] GPU KV cache size: 98,304 tokens, Maximum concurrency "
        "for 32,768 tokens per request: 3.00x\n"
    )
    info = parse_kv_cache_log(log)
    assert info is not None
    assert (info.device, info.capacity_tokens, info.max_model_len) == ("GPU", 98_304, 32_768)
    assert info.kv_space_gib is None


def test_no_capacity_line_gives_none():
    assert parse_kv_cache_log("INFO starting\n") is None


METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",enable_prefix_caching="True",engine="0",kv_cache_memory_bytes="1073741824",kv_cache_size_tokens="524288",num_cpu_blocks="None",num_gpu_blocks="4096"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.0
"""


def test_parses_cache_config_info():
    info = parse_cache_config_info(METRICS)
    assert info is not None
    assert (info.block_size, info.num_blocks, info.capacity_tokens) == (128, 4096, 524_288)
    assert (info.memory_bytes, info.size_tokens_label, info.prefix_caching) == (1 << 30, 524_288, True)
    assert info.bytes_per_token == 2048


def test_cache_config_info_absent_gives_none():
    without = "\n".join(ln for ln in METRICS.splitlines() if "cache_config_info" not in ln)
    assert parse_cache_config_info(without + "\n") is None
