"""Is a simulated run stable? An overloaded run fails whatever its attainment.

A queue that grows without bound can still leave most requests of a short run under the TTFT target: the
run ends before the wait shows. Two checks over the steady window (arrival times, `llmcap.sizing.slo`):
- TTFT trend: the median TTFT of the window's last `edge_frac` of arrivals may exceed that of its first
  `edge_frac` by at most `ttft_growth` × the TTFT target (a queue still growing fails). Requests that
  never got a first token count as infinitely late.
- Served / offered: requests finishing inside the window (whenever they arrived) ÷ requests arriving in it
  must reach `min_served_ratio` (an instance that completes less than it receives falls behind).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from llmcap.sizing.params import SteadyParams
from llmcap.sizing.slo import Window


@dataclass(frozen=True)
class Stability:
    stable: bool
    ttft_start_s: float  # median TTFT of the window's first edge_frac of arrivals
    ttft_end_s: float  # ... and of its last
    served_ratio: float  # finished in the window ÷ arrived in it; nan for a zero-length window
    reason: str  # why it is not stable; "" when it is


def _float(records: pa.Table, name: str) -> np.ndarray:
    return records.column(name).to_numpy(zero_copy_only=False).astype(np.float64)


def stability(records: pa.Table, window: Window, ttft_target_s: float, params: SteadyParams) -> Stability:
    """The two checks of the module docstring on `records` (REQUEST_SCHEMA) over `window`."""
    arrival = _float(records, "arrival_s")
    idx = np.flatnonzero(window.mask(arrival))
    if idx.size == 0:
        return Stability(False, math.nan, math.nan, math.nan, "no arrivals in the steady window")
    idx = idx[np.argsort(arrival[idx], kind="stable")]
    ok = records.column("status").to_numpy(zero_copy_only=False) == "ok"
    ttft = np.where(ok, _float(records, "ttft_s"), np.inf)
    ttft = np.where(np.isnan(ttft), np.inf, ttft)
    k = max(1, int(round(params.edge_frac * idx.size)))
    start, end = float(np.median(ttft[idx[:k]])), float(np.median(ttft[idx[-k:]]))
    served = float(window.mask(_float(records, "finish_s")).sum() / idx.size) if window.length_s > 0 else math.nan

    reasons = []
    limit = params.ttft_growth * ttft_target_s
    if not math.isfinite(end) or end - start > limit:
        reasons.append(f"median TTFT rose {start:.3g} → {end:.3g} s across the steady window (limit +{limit:.3g} s)")
    if served < params.min_served_ratio:  # nan (no window length) compares False: no verdict
        reasons.append(f"served/offered {served:.3f} < {params.min_served_ratio:g}")
    return Stability(not reasons, start, end, served, "; ".join(reasons))
