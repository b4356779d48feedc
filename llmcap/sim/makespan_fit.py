"""In-situ speed calibration: the one factor on a step model's times that makes the simulator
reproduce a measured makespan.

Why. A profile times isolated steps (one prompt alone, c sequences decoding together) at one moment;
an open-loop replay runs mixed prefill+decode steps beside a busy API server and, on a shared machine,
at another moment. On this project's 2-core CI box the vLLM CPU engine served a burst of a held-out
trace excerpt between 13% faster and 25% slower than its profile-calibrated model predicted, from one
session to the next (tests/live/test_sim_fidelity.py prints it every run).

A burst (every request of an excerpt at once, far beyond capacity) is the cheapest faithful measure
of the engine's speed on the workload: its makespan is the time the engine takes to serve the
excerpt's tokens, and arrival-time queueing cannot distort it. The simulator replays the same burst
with every step time × α until its makespan matches: makespan is nearly proportional to α, so the
fixed point α <- α · measured / simulated converges in a few rounds.

What it does not fix: one factor matches the saturated regime the burst measures. Where the engine's
speed depends on the regime (lightly loaded steps slower than saturated ones) or drifts between the
burst and the runs it is applied to, the factor does not carry over (tests/live/test_sim_fidelity.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from llmcap.errors import LlmcapError
from llmcap.perf.calibrate import CalibratedFit
from llmcap.sim import SimConfig, simulate


@dataclass(frozen=True)
class MakespanFit:
    factor: float  # α: every step time of the fitted model × this
    measured_s: float
    unscaled_s: float  # the simulator's makespan with the model as profiled (α = 1)
    fitted_s: float  # ... with α
    iterations: int


def makespan(records: pa.Table) -> float:
    """Last finish - first arrival of a records table (simulated or replayed: REQUEST_SCHEMA)."""
    status = records.column("status").to_pylist()
    if any(s != "ok" for s in status):
        raise LlmcapError(f"makespan: {sum(s != 'ok' for s in status)} of {len(status)} requests did not finish")
    finish = records.column("finish_s").to_numpy(zero_copy_only=False).astype(np.float64)
    return float(finish.max() - records.column("arrival_s").to_numpy().min())


def fit_to_makespan(
    burst: pa.Table,
    fit: CalibratedFit,
    config: SimConfig,
    measured_s: float,
    rtol: float = 1e-3,
    max_iter: int = 12,
) -> tuple[CalibratedFit, MakespanFit]:
    """Scale `fit` so that simulating `burst` (the trace exactly as it was replayed) takes `measured_s`."""
    if not (np.isfinite(measured_s) and measured_s > 0):
        raise LlmcapError(f"measured makespan must be finite and > 0, got {measured_s}")

    def sim(factor: float) -> float:
        return makespan(simulate(burst, fit.scaled(factor), config).records)

    unscaled = sim(1.0)
    factor, got = measured_s / unscaled, 0.0
    for it in range(1, max_iter + 1):
        got = sim(factor)
        if abs(got / measured_s - 1) <= rtol:
            return fit.scaled(factor), MakespanFit(factor, measured_s, unscaled, got, it)
        factor *= measured_s / got
    raise LlmcapError(
        f"speed factor did not converge in {max_iter} rounds: last {factor:.4g}, makespan {got:.4g} s vs {measured_s:.4g} s"
    )
