"""The shapes settled on the whole trace (`Sizer.scenarios`, `Sizer.pick`): each one's analytic plan beside its scenario fit, and
how the chosen one is picked among them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmcap.sizing.scenarios import FitResult
from llmcap.sizing.summary import FinalistSummary
from llmcap.sizing.units import SizedRow


def analytic_cost(row: SizedRow) -> tuple[float, float, str]:
    """The shapes' order by analytic plan: the cheaper first, then the more goodput per GPU, then by key."""
    assert row.plan is not None
    return (row.plan.usd_per_hour, -row.balanced_rps_per_gpu, row.key)


@dataclass(frozen=True)
class Finalist:
    """A shape settled on the whole trace: its analytic plan (`row.plan`) and its scenario fit."""

    row: SizedRow
    fit: FitResult

    @property
    def binding(self) -> str | None:
        """Passing: the scenario one instance fewer fails first; failing: the scenario it still fails."""
        if not self.fit.ok and self.fit.failed is not None:
            return self.fit.failed.scenario.name
        return next((m.failed.scenario.name for m in self.fit.minimality if m.failed is not None), None)

    def describe(self) -> FinalistSummary:
        assert self.row.plan is not None
        plan, failed = self.fit.plan, self.fit.failed
        return {
            "candidate": self.row.key,
            "mode": self.row.mode,
            "analytic_gpus": self.row.plan.total_gpus,
            "analytic_usd_per_hour": self.row.plan.usd_per_hour,
            "gpus": plan.total_gpus,
            "usd_per_hour": plan.usd_per_hour,
            "counts": plan.counts(),
            "passes": self.fit.ok,
            "binding": self.binding,
            "failed": None if failed is None else failed.describe(),
            "cost_limit_usd_per_hour": None if self.fit.ok else self.fit.limit_usd_per_hour,
            "line": self.line(),
        }

    def line(self) -> str:
        assert self.row.plan is not None
        plan, start = self.fit.plan, f"analytic {self.row.plan.total_gpus} GPUs (${self.row.plan.usd_per_hour:,.2f}/h)"
        if self.fit.ok:
            why = f"one instance fewer fails '{self.binding}'" if self.binding else "every pool at 1 instance"
            return f"{self.row.key}: {start} → {plan.total_gpus} GPUs, ${plan.usd_per_hour:,.2f}/h, passes every scenario ({why})"
        failed, limit = self.fit.failed, f"cost limit ${self.fit.limit_usd_per_hour:,.2f}/h"
        if failed is None:
            return f"{self.row.key}: {start} → passes every scenario only at {plan.total_gpus} GPUs, ${plan.usd_per_hour:,.2f}/h, over the {limit}"
        return f"{self.row.key}: {start} → still fails at {plan.total_gpus} GPUs, ${plan.usd_per_hour:,.2f}/h ({limit}): {failed.describe()}"


def closeness(f: Finalist) -> tuple[float, float]:
    """How near a failing shape came: its failing scenario's attainment (1 for one that passes only over the cost
    limit), then the cheaper."""
    failed = f.fit.failed
    return (1.0 if failed is None else failed.attainment, -f.fit.plan.usd_per_hour)


@dataclass(frozen=True)
class Shortlist:
    """The shapes fitted in every scenario (`Sizer.scenarios`), before one is picked."""

    finalists: tuple[Finalist, ...]  # in analytic cost order
    considered: int  # shapes with an analytic plan
    following: SizedRow | None  # the cheapest shape left out of the shortlist (None: none was)


@dataclass(frozen=True)
class Settled:
    chosen: Finalist
    finalists: tuple[Finalist, ...]  # in analytic cost order
    routers: dict[str, dict[str, Any]]  # router -> the chosen shape's fitted outcome under it (when compared)
