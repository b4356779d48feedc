"""The gateway's own Prometheus metrics: what each side served and how fast, as the gateway saw it.

Latency histograms use vLLM's bucket bounds, so a gate reads the gateway's view and an engine's
`/metrics` with the same quantile code (and `histogram_quantile` in PromQL reads both alike).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from llmcap.twin.metrics import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS

OUTCOMES = ("ok", "rejected", "failed_midstream", "client_gone")


class GatewayMetrics:
    def __init__(self) -> None:
        reg = self.registry = CollectorRegistry()
        self.requests = Counter(
            "llmcap_gateway_requests",
            "Requests finished, by the side that served them and outcome.",
            ["side", "outcome"],
            registry=reg,
        )
        self.retries = Counter(
            "llmcap_gateway_retries",
            "Requests that failed on the candidate before their first byte and were retried on the baseline.",
            registry=reg,
        )
        self.weight = Gauge("llmcap_gateway_candidate_weight", "The candidate's share of traffic.", registry=reg)
        self.in_flight = Gauge("llmcap_gateway_in_flight", "Requests in flight, by side.", ["side"], registry=reg)
        self.ttft = Histogram(
            "llmcap_gateway_time_to_first_token_seconds",
            "Time to first token through the gateway.",
            ["side"],
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            "llmcap_gateway_inter_token_latency_seconds",
            "Gaps between token-carrying chunks.",
            ["side"],
            buckets=ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "llmcap_gateway_e2e_request_latency_seconds",
            "End-to-end latency through the gateway.",
            ["side"],
            buckets=E2E_BUCKETS,
            registry=reg,
        )
        self.mirrored = Counter(
            "llmcap_gateway_mirrored", "Requests copied to a shadow target.", ["target"], registry=reg
        )
        self.mirror_dropped = Counter(
            "llmcap_gateway_mirror_dropped",
            "Copies not sent: the shadow target had its bound of requests in flight.",
            ["target"],
            registry=reg,
        )
        self.mirror_failed = Counter(
            "llmcap_gateway_mirror_failed", "Copies the shadow target failed or timed out.", ["target"], registry=reg
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
