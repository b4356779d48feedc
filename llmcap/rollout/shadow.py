"""Shadow traffic (step 6 of the loop): copy a share of production traffic to a candidate that serves
nobody, and check two things.

1. The candidate under that share behaves as the simulator predicted: its TTFT/ITL (the gateway's view of
   the copies), KV usage and waiting queue (its own /metrics) go through the rollout's gates against the
   prediction for the share.
2. The mirror does not hurt production: the same traffic is replayed twice through the gateway, without
   and with the mirror (different prompts of the same lengths, so the baseline's prefix cache does not
   favour the second run), and production TTFT/ITL are compared with a stated bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from llmcap.gateway import Gateway, GatewayConfig, ShadowTarget
from llmcap.live.trace_replay import ReplayResult, replay_async
from llmcap.rollout.gates import GateResult, Prediction, Tolerances, evaluate
from llmcap.rollout.observe import Observation, ScrapeSource

SHADOW = "candidate"  # the shadow target's name at the gateway (its rows and metrics say shadow:candidate)
SAMPLE_S = 1.0  # the shadow engine's gauges are sampled this often during the run
DRAIN_S = 60.0  # copies still streaming this long after the replay ends are cut (counted as failed)


@dataclass(frozen=True)
class ImpactBound:
    """Production with the mirror may be at most this much slower than without it."""

    rel: float = 0.10
    abs_s: float = 0.010

    def limit(self, without: float) -> float:
        return without * (1 + self.rel) + self.abs_s


@dataclass
class ShadowResult:
    share: float
    production: dict[
        str, dict[str, float | None]
    ]  # "without" / "with": requests, ok, ttft_p50_s, ttft_p99_s, itl_p99_s
    impact: list[tuple[str, float | None, float | None, bool]]  # (metric, with, limit, within)
    shadow: Observation
    gates: list[GateResult]
    mirror: dict[str, float]  # mirrored, dropped, failed copies
    rows: dict[str, pa.Table] = field(
        repr=False, default_factory=dict
    )  # the gateway's: production_without, production_with, shadow

    @property
    def production_unharmed(self) -> bool:
        return all(ok for *_, ok in self.impact)

    @property
    def as_predicted(self) -> bool:
        """Every gate passed and at least one had the evidence to be judged."""
        return all(g.passed for g in self.gates) and any(g.judged for g in self.gates)

    def summary(self) -> dict[str, Any]:
        return {
            "share": self.share,
            "production": self.production,
            "production_unharmed": self.production_unharmed,
            "impact": [{"metric": m, "with_mirror": w, "limit": lim, "within": ok} for m, w, lim, ok in self.impact],
            "shadow_as_predicted": self.as_predicted,
            "gates": [g.describe() for g in self.gates],
            "mirror": self.mirror,
            "shadow_requests": self.shadow.requests,
            "shadow_errors": self.shadow.errors,
        }

    def markdown(self) -> str:
        w, wo = self.production["with"], self.production["without"]
        lines = [
            f"# Shadow check: the candidate mirrored {self.share:.0%} of traffic",
            "",
            f"**Production unharmed: {'yes' if self.production_unharmed else 'NO'}** · "
            f"**Candidate as predicted: {'yes' if self.as_predicted else 'NO'}** (predictions are simulated)",
            "",
            "| production | without mirror | with mirror | limit |",
            "|---|---:|---:|---:|",
        ]
        for metric, with_value, limit, ok in self.impact:
            lines.append(
                f"| {metric} | {_ms(wo.get(metric))} | {_ms(with_value)} | {_ms(limit)}{'' if ok else ' **exceeded**'} |"
            )
        lines += [
            "",
            f"Requests: {wo['requests']:.0f} without ({wo['ok']:.0f} ok), {w['requests']:.0f} with ({w['ok']:.0f} ok). "
            f"Copies: {self.mirror['mirrored']:.0f} sent, {self.mirror['dropped']:.0f} dropped at the bound, "
            f"{self.mirror['failed']:.0f} failed.",
            "",
            "## The candidate against its prediction",
            "",
        ]
        lines += [f"- {g.describe()}" for g in self.gates]
        return "\n".join(lines) + "\n"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{1000 * v:.1f} ms"


def _production(res: ReplayResult) -> dict[str, float | None]:
    t = res.requests
    ok = np.asarray(t.column("status").to_pylist()) == "ok"
    ttft = np.asarray(t.column("ttft_s").to_pylist(), dtype=object)[ok].astype(np.float64)
    q = lambda x, p: float(np.percentile(x, p)) if x.size else None  # noqa: E731
    return {
        "requests": float(t.num_rows),
        "ok": float(ok.sum()),
        "ttft_p50_s": q(ttft, 50),
        "ttft_p99_s": q(ttft, 99),
        "itl_p99_s": q(res.itls, 99),
    }


async def _sampling(source: ScrapeSource, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await source.sample()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_S)


async def run_shadow(
    baseline_url: str,
    candidate_url: str,
    model: str,
    arrival_s: np.ndarray,
    isl: np.ndarray,
    osl: np.ndarray,
    share: float,
    prediction: Prediction,
    tolerances: Tolerances = Tolerances(),
    ttft_target_s: float = 2.0,
    bound: ImpactBound = ImpactBound(),
    max_in_flight: int = 256,
    vocab_size: int = 1000,
    timeout_s: float = 600.0,
    drain_s: float = DRAIN_S,
) -> ShadowResult:
    """Replay the traffic without, then with, `share` of it mirrored to the candidate; see the module docstring.
    Copies still streaming `drain_s` after the replay ends are cut and counted as failed."""
    runs: dict[str, ReplayResult] = {}
    rows: dict[str, pa.Table] = {}
    for phase, seed in (("without", 1), ("with", 2)):
        shadows = (ShadowTarget(SHADOW, candidate_url, share, max_in_flight, timeout_s),) if phase == "with" else ()
        gw = Gateway(GatewayConfig(baseline=baseline_url, shadows=shadows))
        await gw.start("127.0.0.1", 0)
        try:
            if phase == "with":
                source = ScrapeSource(gw.url, candidate_url, side=f"shadow:{SHADOW}")
                stop = asyncio.Event()
                await source.sample()
                start = time.time()
                sampler = asyncio.create_task(_sampling(source, stop))
            runs[phase] = await replay_async(
                gw.url, model, arrival_s, isl, osl, seed=seed, vocab_size=vocab_size, timeout_s=timeout_s
            )
            if phase == "with":
                drain_until = time.monotonic() + drain_s
                while gw.mirrors_in_flight and time.monotonic() < drain_until:
                    await asyncio.sleep(0.1)
                await gw.cut_mirrors()  # the rest counts as failed, in the window observed next
                stop.set()
                await sampler
                await source.sample()
                shadow = await source.observe(start, time.time())
                await source.aclose()
        finally:
            await gw.stop()
        rows[f"production_{phase}"] = gw.table()
        if phase == "with":
            rows["shadow"] = gw.shadow_table()
            mirror = {k: float(v) for k, v in gw.mirror_counts[SHADOW].items()}
    production = {phase: _production(r) for phase, r in runs.items()}
    impact = []
    for metric in ("ttft_p50_s", "ttft_p99_s", "itl_p99_s"):
        base, with_mirror = production["without"][metric], production["with"][metric]
        limit = None if base is None else bound.limit(base)
        impact.append((metric, with_mirror, limit, limit is None or with_mirror is None or with_mirror <= limit))
    gates = evaluate(shadow, prediction, tolerances, ttft_target_s)
    return ShadowResult(share, production, impact, shadow, gates, mirror, rows)
