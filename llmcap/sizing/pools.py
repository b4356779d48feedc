"""Request-class pools: one shared pool against one pool per class (e.g. long prompts vs chat).

Each option is a list of pools, each pool sized by `replicas_for` from its own class rate and its own
best configuration's max feasible rate. The comparison is cost per hour; the report says which is
cheaper and by how much. (The per-class max rates come from searches on the class's sub-trace.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmcap.sizing.analytic import ceil_count


@dataclass(frozen=True)
class Pool:
    name: str
    rate_rps: float
    per_instance_rps: float
    gpus_per_instance: int
    usd_per_gpu_hour: float

    @property
    def instances(self) -> int:
        return ceil_count(self.rate_rps / self.per_instance_rps)

    @property
    def gpus(self) -> int:
        return self.instances * self.gpus_per_instance

    @property
    def usd_per_hour(self) -> float:
        return self.gpus * self.usd_per_gpu_hour


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
        other = "shared" if self.cheaper == "split" else "split"
        return (
            f"{self.cheaper} pools are cheaper: ${self.saving_usd_per_hour:,.2f}/h less than {other} "
            f"(shared {sum(p.gpus for p in self.shared)} GPUs ${self.shared_usd_per_hour:,.2f}/h, "
            f"split {sum(p.gpus for p in self.split)} GPUs ${self.split_usd_per_hour:,.2f}/h)"
        )


def compare_pools(shared: Sequence[Pool], split: Sequence[Pool]) -> PoolComparison:
    """Cost of serving the workload from `shared` pool(s) vs from per-class `split` pools (ties: shared)."""
    return PoolComparison(tuple(shared), tuple(split))
