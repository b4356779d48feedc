"""Scrape an engine's Prometheus `/metrics` (prometheus_client's parser) into what the profiler needs.

vLLM names (others differ; absent metrics read as None, never as 0):
- `vllm:cache_config_info` labels: block_size, num_gpu_blocks → KV capacity (engine_kv.py);
- `vllm:num_preemptions` (counter): preemptions so far;
- `vllm:iteration_tokens_total` (histogram): tokens per engine step (sum / count);
- `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (gauges).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from llmcap.live.engine_kv import CacheConfigInfo, parse_cache_config_info


@dataclass(frozen=True)
class MetricsSnapshot:
    """Sample values by sample name (labels summed over: one engine, all its label sets)."""

    samples: dict[str, float] = field(default_factory=dict)
    cache_config: CacheConfigInfo | None = None

    def get(self, name: str) -> float | None:
        return self.samples.get(name)

    @property
    def preemptions(self) -> float | None:
        return self.get("vllm:num_preemptions_total")

    @property
    def iteration_tokens(self) -> tuple[float, float] | None:
        """(Σ tokens, steps) over the engine's life, from the iteration-tokens histogram."""
        s, c = self.get("vllm:iteration_tokens_total_sum"), self.get("vllm:iteration_tokens_total_count")
        return None if s is None or c is None else (s, c)


def parse_metrics(text: str) -> MetricsSnapshot:
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_bucket") or s.name.endswith("_created"):
                continue
            samples[s.name] = samples.get(s.name, 0.0) + float(s.value)
    return MetricsSnapshot(samples=samples, cache_config=parse_cache_config_info(text))


async def scrape(client: httpx.AsyncClient, base_url: str) -> MetricsSnapshot | None:
    """The endpoint's /metrics, or None where it has none."""
    try:
        r = await client.get(f"{base_url}/metrics", timeout=30.0)
    except httpx.HTTPError:
        return None
    return parse_metrics(r.text) if r.status_code == 200 else None


def delta(before: MetricsSnapshot | None, after: MetricsSnapshot | None, name: str) -> float | None:
    """How much counter `name` grew between two snapshots (None if either lacks it)."""
    if before is None or after is None:
        return None
    a, b = before.get(name), after.get(name)
    return None if a is None or b is None else b - a
