"""When no candidate meets the SLOs: how close each one came, and which target stopped it.

For every searched row, the evaluated rate where it came closest (the highest attainment across the
search's rates, averaged over seeds; the lowest such rate on ties) and what failed there: the queue still
growing (overload), a target judged on the whole run (token-level ITL), or the per-request targets, the
one with more misses binding. A user sees which SLO to relax, or which candidate to add, by how much.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from llmcap.errors import LlmcapError
from llmcap.sizing.params import SloParams
from llmcap.sizing.search import RatePoint, SearchResult
from llmcap.sizing.slo import itl_name


@dataclass(frozen=True)
class NearMiss:
    candidate: str  # the row's key (P/D roles: "prefill: KEY", "decode: KEY")
    rate_rps: float  # the rate where it came closest (0: ruled out idle, unsimulated)
    attainment: float  # mean over seeds at that rate
    attainment_target: float
    binding: str  # "idle" (unsimulated) | "overload" | "run" | "ttft" | "itl" (per-request ITL/TPOT targets)
    reason: str  # what failed, in words
    ttft_p99_ms: float | None
    itl_p99_ms: float | None

    def line(self) -> str:
        where = "idle" if self.binding == "idle" else f"at {self.rate_rps:.4g} req/s"
        return f"{self.candidate}: {where} {self.attainment:.1%} of requests met every SLO (target {self.attainment_target:.1%}); {self.reason}"

    def to_dict(self) -> dict:
        return asdict(self) | {"line": self.line()}


class NoFeasiblePlan(LlmcapError):
    """No candidate meets the SLOs at any rate the search tried; `near_misses`, closest first, say how close each came."""

    headline = "no candidate meets the SLOs at any rate the search tried; relax the SLOs or add candidates"

    def __init__(self, near_misses: Sequence[NearMiss]) -> None:
        self.near_misses = tuple(near_misses)
        nearest = f"; nearest: {self.near_misses[0].line()}" if self.near_misses else ""
        super().__init__(self.headline + nearest)


def _mean(point: RatePoint, key: str) -> float | None:
    values = [r.metrics[key] for r in point.results if key in r.metrics]
    return float(np.mean(values)) if values else None


def _targets(slo: SloParams) -> tuple[str, str]:
    ttft = (
        "none"
        if slo.ttft_ms is None
        else f"{slo.ttft_ms:,.0f} ms"
        + (f" + {slo.ttft_ms_per_1k_isl:g} ms per 1k prompt tokens" if slo.ttft_ms_per_1k_isl else "")
    )
    itl = "none" if slo.itl_ms is None else f"{slo.itl_ms:,.0f} ms for {itl_name(slo.itl_stat)}"
    return ttft, itl


def near_miss(candidate: str, result: SearchResult, slo: SloParams) -> NearMiss | None:
    """`result`'s closest point (None when the search evaluated nothing)."""
    points = [p for p in result.points if p.results]
    if not points:
        return None
    best = max(points, key=lambda p: (p.mean_attainment, -p.rate))
    attainment = best.mean_attainment
    ttft_p99, itl_p99 = _mean(best, "ttft_p99_ms"), _mean(best, "itl_p99_ms")
    overload = next((r.overload for r in best.results if r.overload), "")
    run_miss = next((r.run_miss for r in best.results if r.run_miss), "")
    ttft_target, itl_target = _targets(slo)
    shown = f"TTFT p99 {'–' if ttft_p99 is None else f'{ttft_p99:,.0f} ms'} (target {ttft_target}), {itl_name('token_p99')} {'–' if itl_p99 is None else f'{itl_p99:,.1f} ms'} (target {itl_target})"
    if overload:
        binding, reason = "overload", f"the queue kept growing ({overload}); {shown}"
    elif run_miss:
        binding, reason = "run", f"{run_miss}; {shown}"
    else:
        counts = {"ttft": _mean(best, "ttft_misses") or 0.0, "itl": _mean(best, "itl_misses") or 0.0}
        deadline = _mean(best, "deadline_misses")  # only where the trace carries deadlines
        if deadline is not None:
            counts["deadline"] = deadline
        binding = max(counts, key=lambda k: (counts[k], k == "ttft"))  # a tie goes to TTFT
        tally = " vs ".join(
            f"{v:,.0f} {name}" for name, v in zip(("TTFT", "ITL/TPOT", "deadline"), counts.values(), strict=False)
        )
        reason = f"{binding.upper()} binds ({tally} misses in the steady window); {shown}"
    return NearMiss(candidate, best.rate, attainment, result.attainment_target, binding, reason, ttft_p99, itl_p99)


def idle_miss(candidate: str, attainment: float, slo: SloParams) -> NearMiss:
    """A row ruled out unsimulated: alone on an idle instance (each request by itself, no queue) only
    `attainment` of the requests meet the SLOs."""
    ttft_target, itl_target = _targets(slo)
    return NearMiss(
        candidate,
        0.0,
        attainment,
        slo.attainment_target,
        "idle",
        f"even idle, each request alone, it misses (TTFT target {ttft_target}, ITL target {itl_target}): faster GPUs or more TP, or looser SLOs",
        None,
        None,
    )


def near_misses(
    searched: Sequence[tuple[str, SearchResult]], slo: SloParams, idle: Sequence[NearMiss] = ()
) -> list[NearMiss]:
    """Each searched row's near miss and the rows ruled out idle, closest first (highest attainment, then
    lowest rate, then name)."""
    found = [m for key, res in searched if (m := near_miss(key, res, slo)) is not None] + list(idle)
    return sorted(found, key=lambda m: (-m.attainment, m.rate_rps, m.candidate))
