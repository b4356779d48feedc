"""What the candidate did over an evidence window, from the gateway's and the engine's /metrics.

Latency is the gateway's view of the candidate's requests (what users saw, the same for vLLM, SGLang
or the twin); KV usage, the waiting queue and preemptions are the candidate engine's own (vLLM names).
Two sources give the same `Observation`: `ScrapeSource` reads /metrics directly and keeps its samples;
`llmcap.rollout.promql.PromQLSource` asks a Prometheus server that scrapes the same targets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

from llmcap.rollout.histogram import Buckets, histogram

GW_TTFT = "llmcap_gateway_time_to_first_token_seconds"
GW_ITL = "llmcap_gateway_inter_token_latency_seconds"
GW_REQUESTS = "llmcap_gateway_requests_total"
GW_RETRIES = "llmcap_gateway_retries_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"


@dataclass(frozen=True)
class Observation:
    start_s: float  # the evidence window (unix seconds)
    end_s: float
    requests: float  # the candidate's requests that ended in the window (retried ones included)
    errors: float  # of those: rejected, cut mid-stream, or retried on the baseline
    ttft: Buckets | None  # the candidate's TTFT histogram over the window (gateway view)
    itl: Buckets | None
    kv_usage_max: float | None
    waiting_max: float | None
    preemptions: float | None

    @property
    def error_rate(self) -> float | None:
        return None if self.requests <= 0 else self.errors / self.requests


class MetricsSource(Protocol):
    async def sample(self) -> None:
        """Called every evaluation interval (a direct scrape takes its sample; Prometheus scrapes by itself)."""

    async def observe(self, start_s: float, end_s: float) -> Observation: ...

    async def aclose(self) -> None: ...


def _flat(text: str) -> dict[tuple[str, frozenset], float]:
    out: dict[tuple[str, frozenset], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.endswith(("_bucket", "_created")):
                out[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return out


def _sum(flat: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in flat.items() if n == name and want <= ls)


@dataclass
class _Sample:
    t: float
    gateway: str
    engine: str | None
    flat_gateway: dict = field(init=False)
    flat_engine: dict = field(init=False)

    def __post_init__(self) -> None:
        self.flat_gateway = _flat(self.gateway)
        self.flat_engine = _flat(self.engine) if self.engine is not None else {}


class ScrapeSource:
    """Scrapes the gateway's and the candidate engine's /metrics at each `sample()`; a window is read
    from the last sample at or before its start to the last at or before its end."""

    def __init__(
        self, gateway_url: str, engine_url: str | None, client: httpx.AsyncClient | None = None, side: str = "candidate"
    ) -> None:
        self.gateway_url, self.engine_url = gateway_url.rstrip("/"), engine_url.rstrip("/") if engine_url else None
        self.side = side  # the gateway's label for the deployment observed: "candidate", or "shadow:NAME" for a shadow
        self._client = client or httpx.AsyncClient(timeout=10.0)
        self.samples: list[_Sample] = []

    async def aclose(self) -> None:
        await self._client.aclose()

    async def sample(self) -> None:
        t = time.time()
        gateway = (await self._client.get(f"{self.gateway_url}/metrics")).text
        engine = None
        if self.engine_url is not None:
            try:  # a dead candidate has no /metrics: its gauges read as absent, the gateway still counts its errors
                r = await self._client.get(f"{self.engine_url}/metrics")
                engine = r.text if r.status_code == 200 else None
            except httpx.HTTPError:
                engine = None
        self.samples.append(_Sample(t, gateway, engine))

    def _at(self, t: float) -> _Sample | None:
        before = [s for s in self.samples if s.t <= t]
        return before[-1] if before else None

    async def observe(self, start_s: float, end_s: float) -> Observation:
        first, last = self._at(start_s), self._at(end_s)
        if last is None:
            raise ValueError("no sample at or before the window's end: call sample() first")
        within = [s for s in self.samples if start_s <= s.t <= end_s and s.engine is not None]

        def counter(name: str, **labels: str) -> float:
            return _sum(last.flat_gateway, name, **labels) - (
                _sum(first.flat_gateway, name, **labels) if first else 0.0
            )

        retries = counter(GW_RETRIES) if self.side == "candidate" else 0.0  # only the candidate's failures are retried
        done = counter(GW_REQUESTS, side=self.side)
        failed = done - counter(GW_REQUESTS, side=self.side, outcome="ok")

        def hist(name: str) -> Buckets | None:
            now = histogram(last.gateway, name, {"side": self.side})
            return (
                None
                if now is None
                else now.minus(histogram(first.gateway, name, {"side": self.side}) if first else None)
            )

        def gauge_max(name: str) -> float | None:
            return max((_sum(s.flat_engine, name) for s in within), default=None)

        preempt = None
        engines = [s for s in (first, last) if s is not None and s.engine is not None]
        if len(engines) == 2:
            preempt = _sum(engines[1].flat_engine, PREEMPTIONS) - _sum(engines[0].flat_engine, PREEMPTIONS)
        return Observation(
            start_s,
            end_s,
            done + retries,
            failed + retries,
            hist(GW_TTFT),
            hist(GW_ITL),
            gauge_max(KV_USAGE),
            gauge_max(WAITING),
            preempt,
        )
