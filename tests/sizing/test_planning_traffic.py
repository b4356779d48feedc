"""One plan's planning traffic, derived once from its trace (`planning_traffic`) and what the sizer plans from."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from llmcap.catalog import load_model
from llmcap.sizing.headroom import PoolInput, planning_traffic
from llmcap.sizing.params import HeadroomParams, SizeParams
from llmcap.sizing.sizer import Sizer
from llmcap.trace.schema import CANONICAL_SCHEMA
from llmcap.trace.synth import mean_rate

# 121 arrivals one second apart (0 … 120 s) and a burst of 9 more in the first second: 130 requests over 120 s
ARRIVALS = np.sort(np.concatenate([np.arange(121.0), np.arange(1, 10) / 10]))
FORECAST = HeadroomParams(traffic_method="forecast_error", forecast_error=0.25, traffic_window_s=10)


def _trace() -> pa.Table:
    n = ARRIVALS.size
    cols = {
        "request_id": np.arange(n, dtype=np.int64),
        "arrival_s": ARRIVALS,
        "isl": np.full(n, 500),
        "osl": np.full(n, 20),
        "source_row": np.arange(n, dtype=np.int64),
    }
    return pa.table(
        {f.name: cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in CANONICAL_SCHEMA},
        schema=CANONICAL_SCHEMA,
    )


def test_the_planning_traffic_is_the_trace_replayed_at_the_target() -> None:
    trace = _trace()
    own = planning_traffic(trace, None, FORECAST)
    assert own.target_rps == pytest.approx(130 / 120)  # no target given: the trace's own mean rate
    target = 2 * mean_rate(trace)  # every gap halved: arrivals at 0, 0.05 … 0.45, 0.5, 1.0 … 60 s
    traffic = planning_traffic(trace, target, FORECAST)
    assert traffic.target_rps == target and traffic.arrival_s[-1] == pytest.approx(60.0)
    assert traffic.planning_rps == pytest.approx(1.25 * target)  # forecast error 0.25 on top of the target
    # 10 s windows of the replayed clock: the first holds the 9-request burst beside 20 arrivals 0.5 s apart, the
    # other five hold 20 each: peak 29 / 10 s = 2.9 req/s at the target, × 1.25 at the planning rate = 3.625 req/s
    assert traffic.peak_rps(10) == pytest.approx(3.625)


def test_the_sizer_plans_every_pool_from_the_traffic_it_is_handed() -> None:
    trace = _trace()
    params = SizeParams(headroom=FORECAST)
    traffic = planning_traffic(trace, 10.0, FORECAST)
    sizer = Sizer(trace, load_model("Llama-3.1-8B"), params, traffic, None, lambda _msg: None, None)
    assert (sizer.target, sizer.planning) == (10.0, 12.5)  # 10 × (1 + 0.25)
    plan = sizer.plan([PoolInput("instances", 3.0, 1, 8, 2.0)])
    assert (plan.target_rps, plan.planning_rps) == (10.0, 12.5)
    pool = plan.pool("instances")
    assert pool.base_instances == math.ceil(10.0 / 3.0) == 4  # the bare count at the target
    assert pool.survivors == math.ceil(12.5 / 3.0) == 5  # the count every scenario keeps serving, at the planning rate
