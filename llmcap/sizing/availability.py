"""The availability target: the share of requests served within the SLOs over the long run, with nodes failing
and being repaired (the source article lists availability among the minimum SLOs).

A node is down a share d = MTTR / (MTBF + MTTR) of the time (`headroom.node_mtbf_h`, `headroom.node_repair_h`).
With failures independent and rare, a pool of n nodes has one of them down u = n × d of the time, and every
node is up 1 − Σ u over the pools. Two nodes of a pool down at once is left out: that happens (n − 1)·d/2 as
often as one down, 0.3% as often for a 10-node pool at the defaults. Availability is then

    A = (1 − Σ u_p) × attainment(every instance serving) + Σ u_p × attainment(pool p without its fullest node)

each attainment from the whole-trace replay at the planning rate (the scenarios' own simulations, shared with
"traffic" and "node loss: <pool>" where those serve the same instances). A state whose run is overloaded counts
as 0: a repair takes hours, far longer than the replay, and an overloaded queue only grows. The fullest node is
the one lost: pessimistic where a pool's nodes hold unequal shares. The target is met when A ≥ slo.availability.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmcap.errors import LlmcapError

if TYPE_CHECKING:
    from llmcap.sizing.headroom import CapacityPlan
    from llmcap.sizing.params import HeadroomParams
    from llmcap.sizing.search import EvalResult

Serving = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class State:
    """One state the deployment spends a share of its time in."""

    serving: Serving  # (pool, serving instances), in the plan's pool order
    share: float  # of the time
    down: str = ""  # the pool with a node down ("" = every instance serving)


def node_down_share(params: HeadroomParams) -> float:
    """d = MTTR / (MTBF + MTTR): the share of the time one node is down."""
    return params.node_repair_h / (params.node_mtbf_h + params.node_repair_h)


def states(plan: CapacityPlan) -> tuple[State, ...]:
    """Every instance serving, then each pool with its fullest node down, with the share of time of each."""
    base = plan.counts()
    down = []
    for pool in plan.pools:
        share = pool.placement.nodes * node_down_share(pool.params)
        if share > 0:  # a pool with no node (no instance) has none to lose
            down.append(
                State(tuple({**base, pool.name: pool.instances - pool.placement.lost(1)}.items()), share, pool.name)
            )
    total = sum(s.share for s in down)
    if total >= 1:
        raise LlmcapError(
            f"availability: nodes are down {total:.1%} of the time (node_repair_h vs node_mtbf_h); "
            "one node down at a time no longer describes it"
        )
    return (State(tuple(base.items()), 1.0 - total), *down)


def served_share(result: EvalResult) -> float:
    """The state's requests served within the SLOs (an overloaded run: none over a repair's hours)."""
    return 0.0 if result.overload else result.attainment


def availability(judged: list[tuple[State, EvalResult]]) -> float:
    """A of the module docstring."""
    return sum(s.share * served_share(r) for s, r in judged)


def costliest(judged: list[tuple[State, EvalResult]]) -> tuple[State, EvalResult]:
    """The state that loses the most requests over time (share × misses): the one to fix first."""
    return max(judged, key=lambda sr: sr[0].share * (1.0 - served_share(sr[1])))


def describe(judged: list[tuple[State, EvalResult]]) -> str:
    """Each state's share of the time and what it serves, e.g. "all serving 99.88% × 0.9950; prefill node down 0.12% × 0.81"."""
    return "; ".join(
        f"{'all serving' if not s.down else s.down + ' node down'} {s.share:.3%} × {served_share(r):.4f}"
        for s, r in judged
    )
