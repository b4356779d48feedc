"""Request-class pools: one shared pool against one pool per class (e.g. long prompts vs chat).

Each option is a list of pools, each with the base GPUs its own sizing found for its class rate (its
best configuration, P/D pools sized separately). The comparison is cost per hour; the report says which
is cheaper and by how much. (The per-class counts come from sizing the class's sub-trace.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Pool:
    name: str
    rate_rps: float
    gpus: int  # base GPUs of the class's plan (all its pools)
    usd_per_hour: float


@dataclass(frozen=True)
class PoolComparison:
    shared: tuple[Pool, ...]
    split: tuple[Pool, ...]

    @property
    def shared_usd_per_hour(self) -> float:
        return sum(p.usd_per_hour for p in self.shared)

    @property
    def split_usd_per_hour(self) -> float:
        return sum(p.usd_per_hour for p in self.split)

    @property
    def cheaper(self) -> str:
        return "split" if self.split_usd_per_hour < self.shared_usd_per_hour else "shared"

    @property
    def saving_usd_per_hour(self) -> float:
        return abs(self.shared_usd_per_hour - self.split_usd_per_hour)

    def summary(self) -> str:
        """Which is cheaper, every count labelled base: none includes headroom, so none is a plan's total."""
        other = "shared" if self.cheaper == "split" else "split"
        return (
            f"compared on base counts (before headroom), {self.cheaper} pools are cheaper: ${self.saving_usd_per_hour:,.2f}/h base less "
            f"than {other} (shared: {sum(p.gpus for p in self.shared)} base GPUs, ${self.shared_usd_per_hour:,.2f}/h base; "
            f"split: {sum(p.gpus for p in self.split)} base GPUs, ${self.split_usd_per_hour:,.2f}/h base)"
        )


def compare_pools(shared: Sequence[Pool], split: Sequence[Pool]) -> PoolComparison:
    """Cost of serving the workload from `shared` pool(s) vs from per-class `split` pools (ties: shared)."""
    return PoolComparison(tuple(shared), tuple(split))
