"""Gates read from a real Prometheus that scrapes the gateway and the candidate give the same decisions
as the direct scrape on the same run: each evaluation is judged both ways, and every step ends the
same way (held or rolled back) with the same breached gates."""

from __future__ import annotations

import asyncio

import pytest

from llmcap.gateway import GatewayConfig
from llmcap.live.trace_replay import replay_async
from llmcap.rollout.driver import RolloutPlan, run_rollout
from llmcap.rollout.gates import evaluate
from llmcap.rollout.observe import ScrapeSource
from llmcap.rollout.promql import PromQLSource
from tests.gateway._gateway import running_gateway
from tests.rollout._prometheus import prometheus
from tests.rollout.test_rollout_twins import TOL, LocalWeights, predictions, traffic
from tests.twin._twin import SERVED, running_twin

pytestmark = [pytest.mark.timeout(180), pytest.mark.timing]
PLAN = RolloutPlan(steps=(0.25, 0.5, 1.0), hold_s=4.0, interval_s=1.0, ttft_target_s=0.5)


class BothSources:
    """The driver reads the direct scrape; every window is also asked of Prometheus and judged."""

    def __init__(self, scrape: ScrapeSource, prom: PromQLSource, preds: dict) -> None:
        self.scrape, self.prom, self.preds = scrape, prom, preds
        self.weight = 0.0
        self.pairs: list[tuple[float, set[str], set[str]]] = []  # (weight, breached by scrape, breached by PromQL)

    async def sample(self) -> None:
        await self.scrape.sample()

    async def observe(self, start_s: float, end_s: float):
        direct = await self.scrape.observe(start_s, end_s)
        await asyncio.sleep(0.3)  # let Prometheus finish the scrape that covers `end_s`
        via_prom = await self.prom.observe(start_s, end_s)
        pred = self.preds[self.weight]
        judged = [
            {g.gate for g in evaluate(o, pred, TOL, PLAN.ttft_target_s) if g.judged and not g.passed}
            for o in (direct, via_prom)
        ]
        self.pairs.append((self.weight, *judged))
        return direct


class TrackedWeights(LocalWeights):
    def __init__(self, gw, both: BothSources) -> None:
        super().__init__(gw)
        self.both = both

    async def set(self, weight: float) -> None:
        self.both.weight = weight if weight > 0 else self.both.weight
        await super().set(weight)


@pytest.mark.parametrize("slowdown", [1.0, 6.0])
def test_promql_and_direct_scrape_decide_alike(tmp_path, slowdown):
    trace = traffic(PLAN.hold_s * len(PLAN.steps) + 4.0)
    preds = predictions(trace, PLAN.steps)

    async def scenario():
        async with (
            running_twin() as base,
            running_twin(slowdown=slowdown) as cand,
            running_gateway(GatewayConfig(baseline=base.url, candidate=cand.url)) as gw,
            prometheus(tmp_path, {"gateway": gw.url, "candidate": cand.url}) as prom_url,
        ):
            both = BothSources(ScrapeSource(gw.url, cand.url), PromQLSource(prom_url, "gateway", "candidate"), preds)
            load = asyncio.create_task(
                replay_async(
                    gw.url,
                    SERVED,
                    trace.column("arrival_s").to_numpy(),
                    trace.column("isl").to_numpy(),
                    trace.column("osl").to_numpy(),
                    timeout_s=20.0,
                )
            )
            outcome = await run_rollout(PLAN, TrackedWeights(gw, both), both, preds, TOL)
            await asyncio.wait_for(load, 60)
            await both.scrape.aclose()
            await both.prom.aclose()
            return outcome, both.pairs

    outcome, pairs = asyncio.run(scenario())
    assert outcome.status == ("completed" if slowdown == 1.0 else "rolled_back"), outcome.reason
    for w in {p[0] for p in pairs}:
        last_direct, last_prom = [(d, p) for x, d, p in pairs if x == w][-1]
        assert last_direct == last_prom, (w, last_direct, last_prom)  # the step's decision, and the same gates breached
    agree = sum(bool(d) == bool(p) for _, d, p in pairs) / len(pairs)
    assert agree >= 0.8, pairs
