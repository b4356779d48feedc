"""Parse what a live vLLM engine reports about its KV cache: its startup log and `/metrics`.

Pure functions of text, no I/O (the live tests and the profiler share them).

The engine logs its KV capacity once at startup, from the engine core:

    (EngineCore pid=4927) INFO 11-30 04:39:43 [kv_cache_utils.py:2327] CPU KV cache size:
        524,288 tokens, Maximum concurrency for 4,096 tokens per request: 128.00x

("GPU KV cache size" on a GPU; one line per KV cache group/engine, the last one wins), and the
CPU worker logs the KV space it was given:

    (Worker pid=4960) INFO ... [cpu_worker.py:260] Explicitly set (1.0/7.71) GiB for KV cache
        on node 0.

`/metrics` carries the cache config as the labels of the gauge `vllm:cache_config_info`
(block_size, num_gpu_blocks, and on recent versions kv_cache_size_tokens and
kv_cache_memory_bytes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_KV_SIZE = re.compile(
    r"(?P<device>[A-Z]+) KV cache size:\s*(?P<tokens>[\d,]+)\s*tokens"
    r"(?:,\s*Maximum concurrency for\s*(?P<len>[\d,]+)\s*tokens per request:\s*"
    r"(?P<conc>[\d.]+)x)?"
)
_CPU_KV_SPACE = re.compile(r"set \((?P<gib>[\d.]+)/(?P<total>[\d.]+)\) GiB for KV cache", re.IGNORECASE)


@dataclass(frozen=True)
class KVCacheLogInfo:
    """The KV cache facts an engine's startup log states."""

    device: str  # "CPU" or "GPU", as the log line says
    capacity_tokens: int  # "... KV cache size: N tokens"
    max_model_len: int | None  # "Maximum concurrency for L tokens per request"
    max_concurrency: float | None  # "...: C x"
    kv_space_gib: float | None  # CPU only: "Explicitly set (G/total) GiB for KV cache"


def parse_kv_cache_log(text: str) -> KVCacheLogInfo | None:
    """The KV cache capacity the engine logged, or None if the log has no such line (yet).

    The last capacity line wins (a restarted engine appends to the same log).
    """
    text = _ANSI.sub("", text)
    matches = list(_KV_SIZE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    space = list(_CPU_KV_SPACE.finditer(text))
    return KVCacheLogInfo(
        device=m["device"],
        capacity_tokens=int(m["tokens"].replace(",", "")),
        max_model_len=int(m["len"].replace(",", "")) if m["len"] else None,
        max_concurrency=float(m["conc"]) if m["conc"] else None,
        kv_space_gib=float(space[-1]["gib"]) if space else None,
    )


@dataclass(frozen=True)
class CacheConfigInfo:
    """The labels of `vllm:cache_config_info` that size the KV cache."""

    block_size: int
    num_blocks: int  # label num_gpu_blocks (named so on CPU too)
    capacity_tokens: int  # num_blocks * block_size
    memory_bytes: int | None  # label kv_cache_memory_bytes, where the version has it
    size_tokens_label: int | None  # label kv_cache_size_tokens, where the version has it
    prefix_caching: bool | None
    labels: dict[str, str]

    @property
    def bytes_per_token(self) -> float | None:
        if self.memory_bytes is None or not self.capacity_tokens:
            return None
        return self.memory_bytes / self.capacity_tokens


def _int_label(labels: dict[str, str], key: str) -> int | None:
    value = labels.get(key)
    if value is None or value in ("None", ""):
        return None
    return int(float(value))


def parse_cache_config_info(metrics_text: str) -> CacheConfigInfo | None:
    """`vllm:cache_config_info` from a Prometheus exposition text, or None if absent."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        if family.name != "vllm:cache_config_info":
            continue
        for sample in family.samples:
            labels = dict(sample.labels)
            block_size = _int_label(labels, "block_size")
            num_blocks = _int_label(labels, "num_gpu_blocks")
            if block_size is None or num_blocks is None:
                continue
            pc = labels.get("enable_prefix_caching")
            return CacheConfigInfo(
                block_size=block_size,
                num_blocks=num_blocks,
                capacity_tokens=block_size * num_blocks,
                memory_bytes=_int_label(labels, "kv_cache_memory_bytes"),
                size_tokens_label=_int_label(labels, "kv_cache_size_tokens"),
                prefix_caching=None if pc is None else pc == "True",
                labels=labels,
            )
    return None
