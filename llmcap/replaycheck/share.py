"""The unit's traffic: the share of the trace one instance of the plan receives, arrival times kept.

With the plan's deployment record (summary.json `deployment`, `llmcap.sizing.planned`) the share is drawn the
way the plan's own router draws it: a window of the trace replayed through the whole deployment in the
simulator, and the requests its router sent the busiest instance of the unit's pool (for P/D, the prefill pool:
the unit's decode instance then serves all of them). Without one it is a round-robin split, every k-th request.
Either way the trace's bursts reach the unit as they would reach one instance, instead of an excerpt
stretched in time. `load` multiplies the planning rate the share is drawn at (1: the plan's traffic)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from llmcap.sim import simulate
from llmcap.sizing.planned import PlannedDeployment
from llmcap.trace.synth import mean_rate, scale_rate, spread_ties


@dataclass(frozen=True)
class Share:
    """How one unit's requests are drawn from a window of the trace at `load` x the planning rate."""

    planning_rps: float
    instances_per_unit_rate: float  # N: the planning rate over the unit's mean share of it at load 1
    deployment: PlannedDeployment | None = None  # None: round-robin over N instances
    pool: str = "prefill"  # the deployment's pool the unit's instance is drawn from

    @property
    def router(self) -> str:
        if self.deployment is None:
            return "round-robin"
        return f"the plan's {self.deployment.config.router} router"

    def window(self, requests: int) -> int:
        """Consecutive trace requests whose share holds `requests` at any load (a round robin: exactly; the plan's
        router: about, with 10% spare, since it routes unevenly)."""
        spare = 1.0 if self.deployment is None else 1.1
        return max(2, math.ceil(round(spare * requests * max(1.0, self.instances_per_unit_rate), 6)))

    def on_clock(self, trace: pa.Table, seed: int) -> pa.Table:
        """The trace on the planning clock, ties spread as the size stage spreads them."""
        return scale_rate(spread_ties(trace, np.random.default_rng(seed)), self.planning_rps)

    def take(self, part: pa.Table, load: float, seed: int) -> tuple[pa.Table, float, str]:
        """The unit's requests of `part` (a window on the planning clock) at `load`, the window's span on their
        clock (s), and how they were drawn."""
        n = self.instances_per_unit_rate
        if self.deployment is None:
            if n <= 1:  # the unit's rate is above the planning rate: every request, closer together
                closer = _closer(part, load / n)
                return closer, _span(closer), f"every request, {load / n:.3g}x closer in time"
            i = np.arange(part.num_rows, dtype=np.float64)
            picked = np.flatnonzero(np.floor((i + 1) / n) > np.floor(i / n))
            closer = _closer(part, load)
            return closer.take(picked), _span(closer), f"round-robin share 1 in {n:.3g}"
        compressed = _closer(part, load)
        step, decode = self.deployment.step_times()
        records = simulate(
            compressed, step, self.deployment.config, rng=np.random.default_rng(seed), decode_model=decode
        ).records
        replica = records.column("prefill_replica").to_numpy(zero_copy_only=False)
        busiest = int(np.bincount(replica[replica >= 0]).argmax())
        ids = records.column("request_id").to_numpy()[replica == busiest]
        picked = np.flatnonzero(np.isin(compressed.column("request_id").to_numpy(), ids))
        return (
            compressed.take(picked),
            _span(compressed),
            f"{self.router}'s share to its busiest {'' if self.pool == 'instances' else self.pool + ' '}instance",
        )


def _closer(part: pa.Table, load: float) -> pa.Table:
    """`part` (on the planning clock) at `load` x its rate: every gap divided by `load`."""
    return scale_rate(part, mean_rate(part) * load)


def _span(table: pa.Table) -> float:
    arrival = table.column("arrival_s").to_numpy()
    return float(arrival[-1] - arrival[0])
