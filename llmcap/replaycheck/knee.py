"""The load the replay check brackets: where the simulator predicts the unit stops holding its share.

The unit replays its share of the trace (`llmcap.replaycheck.share`), bursts kept; one instance meets a burst
with only what its router sends it. The check's scales are multiples of the highest load (a multiple of the
planning rate) at which the simulator's prediction of the unit on that share still holds the SLOs, found by
bisection from the plan's own traffic, so the verdict compares the measured knee with a prediction of the very
requests replayed."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyarrow as pa

from llmcap.config import ReplayParams
from llmcap.perf.model import StepTimeModel
from llmcap.replaycheck.runs import Run, plan_runs, predict
from llmcap.replaycheck.share import Share
from llmcap.sim import SimConfig
from llmcap.sizing.params import SloParams
from llmcap.sizing.slo import attainment

REL_TOL = 0.02  # bisection stops when the bracket is this narrow (relative)
REACH = 64.0  # loads searched within [1 / REACH, REACH] x the planning rate


@dataclass(frozen=True)
class Knee:
    load: float  # x the planning rate: the highest found to hold (the lowest tried when none held)
    rate_rps: float  # the unit's mean rate over its 1x runs' windows at that load
    held: bool  # False: no load tried held; `load` is the search's floor
    simulations: int
    basis: str


def share_knee(
    trace: pa.Table,
    share: Share,
    prediction: tuple[SimConfig, StepTimeModel, StepTimeModel | None],
    params: ReplayParams,
    slo: SloParams,
) -> Knee:
    """The highest load at which the prediction of every seed's run holds `slo`'s attainment target, the runs
    drawn as the check draws them (`plan_runs`), by geometric bisection."""
    tried: dict[float, list[Run]] = {}
    held: dict[float, bool] = {}

    def holds(load: float) -> bool:
        if load not in held:
            runs = plan_runs(trace, share, load, [1.0], params.excerpt_seeds, params.excerpt_requests)
            tried[load] = runs
            held[load] = all(attainment(predict(r, *prediction), slo) >= slo.attainment_target for r in runs)
        return held[load]

    lo = hi = 1.0
    if holds(1.0):
        while holds(hi) and hi < REACH:
            lo, hi = hi, hi * 2
    else:
        while not holds(lo) and lo > 1 / REACH:
            lo, hi = lo / 2, lo
    if holds(lo) and not holds(hi):
        while hi / lo > 1 + REL_TOL:
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    if held[hi]:  # held all the way to the cap: bracket the cap
        lo = hi
    rate = sum(r.rate_rps for r in tried[lo]) / len(tried[lo])
    where = (
        f"{share.router}'s share of the trace; bisection over the load from the plan's traffic, {len(held)} simulations"
    )
    if not held[lo]:
        basis = f"no load down to {lo:.3g}x the planning rate held in simulation on {where}: bracketing that floor"
    elif lo == hi:
        basis = f"every load up to the search's cap of {hi:g}x the planning rate held in simulation on {where}"
    else:
        basis = f"the simulator's highest load at which this unit holds the SLOs on {where}"
    return Knee(lo, rate, held[lo], len(held), basis)
