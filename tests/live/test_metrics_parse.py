"""/metrics parsing (no engine needed; lines recorded from vLLM 0.32.0 CPU — the live acceptance test
scrapes the real engine through the same code)."""

from __future__ import annotations

from llmcap.live.metrics import delta, parse_metrics

RECORDED = """\
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny-llama"} 3.0
vllm:num_preemptions_created{engine="0",model_name="tiny-llama"} 1.7960165974135194e+09
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="tiny-llama"} 3000.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="tiny-llama"} 4876.0
vllm:iteration_tokens_total_count{engine="0",model_name="tiny-llama"} 4876.0
vllm:iteration_tokens_total_sum{engine="0",model_name="tiny-llama"} 268332.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",engine="0",kv_cache_memory_bytes="1073741824",kv_cache_size_tokens="524288",num_cpu_blocks="None",num_gpu_blocks="4096"} 1.0
"""


def test_reads_counters_histogram_sums_and_the_cache_config() -> None:
    snap = parse_metrics(RECORDED)
    assert snap.preemptions == 3.0
    assert snap.iteration_tokens == (268332.0, 4876.0)
    assert "vllm:iteration_tokens_total_bucket" not in snap.samples  # buckets are not summed into noise
    assert snap.cache_config is not None and snap.cache_config.capacity_tokens == 524_288


def test_delta_of_a_counter_and_missing_metrics_are_none() -> None:
    before = parse_metrics(RECORDED)
    after = parse_metrics(RECORDED.replace("} 3.0\n", "} 5.0\n", 1))
    assert delta(before, after, "vllm:num_preemptions_total") == 2.0
    assert delta(before, after, "sglang:num_preemptions_total") is None
    assert delta(None, after, "vllm:num_preemptions_total") is None
    assert parse_metrics("").preemptions is None
