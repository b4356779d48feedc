"""The gates as PromQL: `queries` over an engine's own vLLM metrics (what an Argo Rollouts
AnalysisTemplate asks, one query per gate; `selector` picks the candidate's series, e.g.
`job="llama-canary"`, `window` is a PromQL range such as "60s"), and `PromQLSource`, the rollout's
metrics source read from a Prometheus server instead of a direct scrape."""

from __future__ import annotations

import math

import httpx
import numpy as np

from llmcap.errors import LlmcapError
from llmcap.rollout.gates import TTFT_BOUNDS
from llmcap.rollout.histogram import Buckets
from llmcap.rollout.observe import GW_ITL, GW_REQUESTS, GW_RETRIES, GW_TTFT, KV_USAGE, PREEMPTIONS, WAITING, Observation


def attainment_bound(ttft_target_s: float) -> float:
    """The largest TTFT bucket bound at or below the target: PromQL counts only whole buckets, so the
    attainment query is exact at a bound and conservative in between."""
    finite = TTFT_BOUNDS[np.isfinite(TTFT_BOUNDS)]
    below = finite[finite <= ttft_target_s + 1e-12]
    return float(below[-1]) if below.size else float(finite[0])


def queries(selector: str, window: str, ttft_target_s: float) -> dict[str, str]:
    le = attainment_bound(ttft_target_s)
    sel = "{" + selector + "}"
    rsel = "{" + selector + (", " if selector else "") + f'le="{le:g}"' + "}"
    return {
        "ttft_p99": f"histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{sel}[{window}])))",
        "itl_p99": f"histogram_quantile(0.99, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket{sel}[{window}])))",
        "attainment": (
            f"sum(rate(vllm:time_to_first_token_seconds_bucket{rsel}[{window}])) / "
            f"sum(rate(vllm:time_to_first_token_seconds_count{sel}[{window}]))"
        ),
        "kv_usage": f"max(max_over_time(vllm:kv_cache_usage_perc{sel}[{window}]))",
        "waiting": f"max(max_over_time(vllm:num_requests_waiting{sel}[{window}]))",
        "preemptions": (
            f"sum(increase(vllm:num_preemptions_total{sel}[{window}])) / "
            f"clamp_min(sum(increase(vllm:request_success_total{sel}[{window}])), 1)"
        ),
    }


class PromQLSource:
    """The same `Observation` as `ScrapeSource`, asked of a Prometheus server that scrapes the gateway
    (job `gateway_job`) and the candidate engine (job `engine_job`). Bucket vectors come back from
    `increase(...)` and go through the same quantile code; `increase` extrapolates every bucket of a
    series set by the same factor, so quantiles match a direct scrape's and only counts are scaled."""

    def __init__(
        self, prometheus_url: str, gateway_job: str, engine_job: str, client: httpx.AsyncClient | None = None
    ) -> None:
        self.url = prometheus_url.rstrip("/") + "/api/v1/query"
        self.gw, self.engine = f'job="{gateway_job}"', f'job="{engine_job}"'
        self._client = client or httpx.AsyncClient(timeout=10.0)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def sample(self) -> None:
        """Nothing to do: Prometheus scrapes on its own schedule."""

    async def _query(self, promql: str, at: float) -> list[tuple[dict, float]]:
        r = await self._client.get(self.url, params={"query": promql, "time": f"{at:.3f}"})
        doc = r.json()
        if r.status_code != 200 or doc.get("status") != "success":
            raise LlmcapError(f"Prometheus at {self.url} refused {promql!r}: {doc.get('error', r.status_code)}")
        return [(item["metric"], float(item["value"][1])) for item in doc["data"]["result"]]

    async def _scalar(self, promql: str, at: float) -> float | None:
        values = [v for _, v in await self._query(promql, at) if not math.isnan(v)]
        return values[0] if values else None

    async def _buckets(self, name: str, window: str, at: float) -> Buckets | None:
        rows = await self._query(f'sum by (le) (increase({name}_bucket{{{self.gw}, side="candidate"}}[{window}]))', at)
        if not rows:
            return None
        pairs = sorted((float(m["le"]), v) for m, v in rows)
        return Buckets(np.array([b for b, _ in pairs]), np.array([v for _, v in pairs]))

    async def observe(self, start_s: float, end_s: float) -> Observation:
        window = f"{max(1, int(round((end_s - start_s) * 1000)))}ms"
        done = (
            await self._scalar(f'sum(increase({GW_REQUESTS}{{{self.gw}, side="candidate"}}[{window}]))', end_s) or 0.0
        )
        ok = (
            await self._scalar(
                f'sum(increase({GW_REQUESTS}{{{self.gw}, side="candidate", outcome="ok"}}[{window}]))', end_s
            )
            or 0.0
        )
        retries = await self._scalar(f"sum(increase({GW_RETRIES}{{{self.gw}}}[{window}]))", end_s) or 0.0
        return Observation(
            start_s,
            end_s,
            done + retries,
            done - ok + retries,
            await self._buckets(GW_TTFT, window, end_s),
            await self._buckets(GW_ITL, window, end_s),
            await self._scalar(f"max(max_over_time({KV_USAGE}{{{self.engine}}}[{window}]))", end_s),
            await self._scalar(f"max(max_over_time({WAITING}{{{self.engine}}}[{window}]))", end_s),
            await self._scalar(f"sum(increase({PREEMPTIONS}{{{self.engine}}}[{window}]))", end_s),
        )
