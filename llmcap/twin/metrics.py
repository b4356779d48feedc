"""The twin's /metrics: vLLM's metric names and types, so the scrapers written for vLLM read it
(`llmcap.live.metrics.parse_metrics`), every sample labelled `twin="llmcap"` and a separate
`llmcap_twin_info` gauge, so nobody mistakes it for a measurement.

Per engine (label `engine`, the replica's index in the deployment, prefill pool first), like a
data-parallel vLLM: running/waiting requests, KV usage, preemptions, iteration tokens (from the
replicas, read at scrape time), and under P/D each prefill replica's KV-link busy seconds
(`llmcap_twin_kv_link_busy_seconds`); prompt/generation tokens, prefix-cache queries/hits, finished
requests and the TTFT / ITL / E2E histograms (recorded as tokens go out, in twin seconds).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from llmcap.twin.online import OnlineCluster

TWIN_LABEL = {"twin": "llmcap"}
# vLLM v1's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class _EngineState:
    """Gauges and counters read from the replicas at scrape time."""

    def __init__(self, twin: TwinMetrics) -> None:
        self.twin = twin

    def collect(self) -> Iterable[Metric]:
        t = self.twin
        labels = ["model_name", "engine", "twin"]
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Requests in model execution batches (twin).", labels=labels
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Requests waiting to be processed (twin).", labels=labels
        )
        usage = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = 100% (twin).", labels=labels)
        preempt = CounterMetricFamily("vllm:num_preemptions", "Cumulative preemptions (twin).", labels=labels)
        steps = HistogramMetricFamily("vllm:iteration_tokens_total", "Tokens per engine step (twin).", labels=labels)
        for r in t.cluster.replicas:
            lv = [t.model_name, str(r.gid), "llmcap"]
            running.add_metric(lv, len(r.running))
            waiting.add_metric(lv, r.waiting.size())
            usage.add_metric(lv, r.kv.used / r.cfg.num_blocks)
            preempt.add_metric(lv, r.preemptions)
            steps.add_metric(lv, buckets=[("+Inf", float(r.step_clock))], sum_value=float(r.tokens))
        ec = t.cluster.cfg.engine
        cache = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig (twin).",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching", "twin"],
        )
        cache.add_metric([str(ec.block_size), str(ec.num_blocks), str(ec.enable_prefix_caching), "llmcap"], 1.0)
        info = GaugeMetricFamily(
            "llmcap_twin_info",
            "This endpoint is llmcap's digital twin: a simulator, not a measurement.",
            labels=sorted(t.info),
        )
        info.add_metric([t.info[k] for k in sorted(t.info)], 1.0)
        slowdown = GaugeMetricFamily("llmcap_twin_slowdown", "Current step-time slowdown factor (fault knob).")
        slowdown.add_metric([], t.slowdown)
        faults = CounterMetricFamily("llmcap_twin_injected_errors", "HTTP 500s injected by --error-rate.")
        faults.add_metric([], t.injected_errors)
        lag = GaugeMetricFamily(
            "llmcap_twin_max_lag_seconds", "Latest the twin ran a simulated decision behind its wall time (wall s)."
        )
        lag.add_metric([], t.max_lag_s)
        link = CounterMetricFamily(
            "llmcap_twin_kv_link_busy_seconds",
            "Seconds each prefill replica's P->D KV link was busy (simulated; vLLM has no standard metric for it).",
            labels=labels,
        )
        for r, ln in zip(
            t.cluster.front, t.cluster.links, strict=False
        ):  # P/D only (no links aggregated): one per prefill replica
            link.add_metric([t.model_name, str(r.gid), "llmcap"], ln.busy_s)
        return [running, waiting, usage, preempt, steps, cache, info, slowdown, faults, lag, link]


class TwinMetrics:
    def __init__(self, cluster: OnlineCluster, model_name: str, info: dict[str, str]) -> None:
        self.cluster = cluster
        self.model_name = model_name
        self.info = info
        self.slowdown = 1.0
        self.injected_errors = 0
        self.max_lag_s = 0.0
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine", "twin"]
        reg = self.registry
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed (twin).", labels, registry=reg)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generation tokens processed (twin).", labels, registry=reg
        )
        self.queries = Counter(
            "vllm:prefix_cache_queries", "Prefix-cache queries, in tokens (twin).", labels, registry=reg
        )
        self.hits = Counter("vllm:prefix_cache_hits", "Prefix-cache hits, in tokens (twin).", labels, registry=reg)
        self.success = Counter(
            "vllm:request_success", "Finished requests (twin).", [*labels, "finished_reason"], registry=reg
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token (twin seconds).",
            labels,
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Inter-token latency (twin seconds).",
            labels,
            buckets=ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency (twin seconds).",
            labels,
            buckets=E2E_BUCKETS,
            registry=reg,
        )
        reg.register(_EngineState(self))

    def _lv(self, gid: int) -> tuple[str, str, str]:
        return self.model_name, str(gid), "llmcap"

    def first_token(self, gid: int, isl: int, cached: int, ttft_s: float) -> None:
        lv = self._lv(gid)
        self.prompt_tokens.labels(*lv).inc(isl)
        self.queries.labels(*lv).inc(isl)
        self.hits.labels(*lv).inc(cached)
        self.ttft.labels(*lv).observe(ttft_s)

    def tokens(self, gid: int, n: int, gaps: Iterable[float]) -> None:
        lv = self._lv(gid)
        self.generation_tokens.labels(*lv).inc(n)
        hist = self.itl.labels(*lv)
        for g in gaps:
            hist.observe(g)

    def finished(self, gid: int, e2e_s: float) -> None:
        lv = self._lv(gid)
        self.success.labels(*lv, "length").inc()
        self.e2e.labels(*lv).observe(e2e_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
