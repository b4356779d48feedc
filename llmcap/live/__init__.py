"""Talking to live engines: streaming client, /metrics scrape, endpoint profiler, bench import, open-loop replay.

Any OpenAI-compatible streaming server works; vLLM extras (`return_token_ids`, `ignore_eos`,
`vllm:` metrics) are used where present. No module here imports the orchestration stack.
"""

from llmcap.live.bench_import import BenchRun, read_vllm_bench
from llmcap.live.client import StreamResult, async_client, stream_completion, token_prompt
from llmcap.live.engine_kv import CacheConfigInfo, KVCacheLogInfo, parse_cache_config_info, parse_kv_cache_log
from llmcap.live.metrics import MetricsSnapshot, parse_metrics
from llmcap.live.profiler import (
    EndpointMeasurement,
    ProfileSpec,
    endpoint_fingerprint,
    measure_endpoint,
    to_profile,
)
from llmcap.live.trace_replay import ReplayResult, replay, replay_async

__all__ = [
    "BenchRun",
    "CacheConfigInfo",
    "EndpointMeasurement",
    "KVCacheLogInfo",
    "MetricsSnapshot",
    "ProfileSpec",
    "ReplayResult",
    "StreamResult",
    "async_client",
    "endpoint_fingerprint",
    "measure_endpoint",
    "parse_cache_config_info",
    "parse_kv_cache_log",
    "parse_metrics",
    "read_vllm_bench",
    "replay",
    "replay_async",
    "stream_completion",
    "to_profile",
    "token_prompt",
]
