"""Which Prometheus metric carries which engine quantity, per engine version.

vLLM renamed metrics between versions, so a diagnosis reads names through a schema instead of
hard-coding them:
- vLLM PR #18354 (v0.9.1) deprecated `vllm:gpu_cache_usage_perc` and `vllm:gpu_prefix_cache_{queries,hits}`
  for `vllm:kv_cache_usage_perc` and `vllm:prefix_cache_{queries,hits}` (the old ones are hidden later);
- vLLM 0.11 deprecated `vllm:time_per_output_token_seconds` (a per-gap histogram despite its name) for
  `vllm:inter_token_latency_seconds`; it was removed in 0.13 (PR #32661).
vLLM has no standard metric for the P→D KV-transfer link's occupancy; the twin exports
`llmcap_twin_kv_link_busy_seconds_total` (seconds the link was busy), so `kv_link_busy` is None for vLLM.
Counters carry their `_total` sample name; histograms are read through `_sum` / `_count`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from llmcap.errors import LlmcapError


@dataclass(frozen=True)
class MetricSchema:
    name: str
    waiting: str  # gauge: requests waiting
    running: str  # gauge: requests in the running batch
    kv_usage: str  # gauge: KV-cache usage, 1 = full (per engine)
    preemptions: str  # counter
    prefix_queries: str | None  # counter, tokens
    prefix_hits: str | None  # counter, tokens
    itl: str  # histogram (seconds): its _sum / _count
    kv_link_busy: str | None = None  # counter: seconds the P→D link was busy

    def names(self) -> dict[str, str]:
        """Quantity -> the sample name read from the series (histograms by their _sum and _count)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "name" or v is None:
                continue
            if f.name == "itl":
                out["itl_sum"], out["itl_count"] = f"{v}_sum", f"{v}_count"
            else:
                out[f.name] = v
        return out


_COMMON = {
    "waiting": "vllm:num_requests_waiting",
    "running": "vllm:num_requests_running",
    "preemptions": "vllm:num_preemptions_total",
}
SCHEMAS = {
    "vllm<0.9.1": MetricSchema(
        "vllm<0.9.1",
        kv_usage="vllm:gpu_cache_usage_perc",
        prefix_queries="vllm:gpu_prefix_cache_queries_total",
        prefix_hits="vllm:gpu_prefix_cache_hits_total",
        itl="vllm:time_per_output_token_seconds",
        **_COMMON,
    ),
    "vllm<0.11": MetricSchema(
        "vllm<0.11",
        kv_usage="vllm:kv_cache_usage_perc",
        prefix_queries="vllm:prefix_cache_queries_total",
        prefix_hits="vllm:prefix_cache_hits_total",
        itl="vllm:time_per_output_token_seconds",
        **_COMMON,
    ),
    "vllm>=0.11": MetricSchema(
        "vllm>=0.11",
        kv_usage="vllm:kv_cache_usage_perc",
        prefix_queries="vllm:prefix_cache_queries_total",
        prefix_hits="vllm:prefix_cache_hits_total",
        itl="vllm:inter_token_latency_seconds",
        **_COMMON,
    ),
    "llmcap-twin": MetricSchema(
        "llmcap-twin",
        kv_usage="vllm:kv_cache_usage_perc",
        prefix_queries="vllm:prefix_cache_queries_total",
        prefix_hits="vllm:prefix_cache_hits_total",
        itl="vllm:inter_token_latency_seconds",
        kv_link_busy="llmcap_twin_kv_link_busy_seconds_total",
        **_COMMON,
    ),
}


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.lstrip("v").split("+")[0].split(".")[:3])
    except ValueError:
        raise LlmcapError(f"engine version {text!r}: expected numbers like 0.11.2") from None


def schema_for(engine: str, version: str | None = None) -> MetricSchema:
    """The schema of `engine` ("vllm", "llmcap-twin") at `version` (vLLM: None means the newest)."""
    if engine == "llmcap-twin":
        return SCHEMAS["llmcap-twin"]
    if engine != "vllm":
        raise LlmcapError(f"no metric schema for engine {engine!r} (known: vllm, llmcap-twin)")
    if version is None:
        return SCHEMAS["vllm>=0.11"]
    v = _version(version)
    return SCHEMAS["vllm<0.9.1"] if v < (0, 9, 1) else SCHEMAS["vllm<0.11"] if v < (0, 11) else SCHEMAS["vllm>=0.11"]


def detect_schema(sample_names: set[str]) -> MetricSchema:
    """The schema most of whose names the series carries (on a tie, vLLM's: the twin's wins only by its own metric)."""
    return max(
        SCHEMAS.values(), key=lambda s: (sum(n in sample_names for n in s.names().values()), s.name != "llmcap-twin")
    )
