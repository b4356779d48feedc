"""What the whole-deployment checks replay (`llmcap.sizing.checked`): the whole trace, or a long trace's busiest span
of `size.whole_trace_max_requests` requests, replayed on the whole trace's planning clock."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from llmcap.catalog import load_model
from llmcap.sizing.checked import MAX_DENSITY, checked_traffic
from llmcap.sizing.headroom import planning_traffic
from llmcap.sizing.params import SizeParams
from llmcap.sizing.simeval import SimEvaluate
from llmcap.sizing.sizer import Sizer
from llmcap.trace.schema import CANONICAL_SCHEMA
from llmcap.trace.synth import mean_rate, scale_rate


def _trace(arrival: np.ndarray, isl: np.ndarray | None = None) -> pa.Table:
    n = arrival.size
    cols = {
        "request_id": np.arange(n, dtype=np.int64),
        "arrival_s": arrival.astype(np.float64),
        "isl": np.full(n, 500) if isl is None else isl,
        "osl": np.full(n, 20),
        "source_row": np.arange(n, dtype=np.int64),
    }
    return pa.table(
        {f.name: cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in CANONICAL_SCHEMA},
        schema=CANONICAL_SCHEMA,
    )


def _arrivals(gaps: dict[tuple[int, int], float], n: int = 1000) -> np.ndarray:
    """`n` arrivals one second apart, except the gaps before requests [a, b), which are `gaps[(a, b)]` seconds."""
    gap = np.ones(n)
    gap[0] = 0.0
    for (a, b), g in gaps.items():
        gap[a:b] = g
    return np.cumsum(gap)


BUSY = _arrivals({(601, 700): 0.6})  # requests 600–699 arrive 0.6 s apart: the busy period


def test_a_trace_within_the_limit_is_checked_whole():
    trace = _trace(BUSY)
    for limit in (0, 1000, 5000):
        c = checked_traffic(trace, limit)
        assert c.whole and c.trace.num_rows == 1000 and c.rate_factor == 1.0 and c.first == 0
        assert c.describe() == "the whole trace (1,000 requests)"


def test_a_long_trace_is_checked_on_its_busiest_span():
    trace = _trace(BUSY)
    c = checked_traffic(trace, 100)
    assert not c.whole and (c.first, c.trace.num_rows, c.total) == (600, 100, 1000)  # the 0.6 s stretch
    assert c.rate_factor == pytest.approx(mean_rate(c.trace) / mean_rate(trace))
    assert 1.5 < c.rate_factor <= MAX_DENSITY
    assert "requests 601–700 of 1,000" in c.describe()


def test_a_cluster_of_bursts_denser_than_a_period_is_not_the_span():
    # requests 300–399 arrive 0.01 s apart: 100 requests in a second, far past what any period of this trace holds
    trace = _trace(_arrivals({(301, 400): 0.01, (601, 700): 0.6}))
    c = checked_traffic(trace, 100)
    assert c.rate_factor <= MAX_DENSITY * 100 / 99  # a span of M requests has M − 1 gaps
    assert c.first < 300 < c.first + 100  # part of the cluster with the calm before it, not the cluster alone


def test_the_busiest_span_is_judged_by_work_per_second_not_arrivals():
    # evenly spaced arrivals; requests 200–299 have prompts 10× longer
    isl = np.where((np.arange(1000) >= 200) & (np.arange(1000) < 300), 5000, 500)
    c = checked_traffic(_trace(np.arange(1000.0), isl), 100)
    assert c.first == 200 and c.rate_factor == pytest.approx((100 / 99) / (1000 / 999))


def test_the_span_is_replayed_on_the_whole_traces_planning_clock():
    trace = _trace(_arrivals({(3001, 4000): 0.6}, n=5000))  # requests 3000–3999 arrive 0.6 s apart
    params = SizeParams(whole_trace_max_requests=1000)
    traffic = planning_traffic(trace, 2.5, params.headroom)
    sizer = Sizer(trace, load_model("Llama-3.1-8B"), params, traffic, None, lambda _msg: None, None)
    checked = sizer.checked
    assert checked.first == 3000
    # what a whole-deployment evaluation of the span replays (its workload needs no step model or engine)
    span = checked.trace.num_rows
    ev = SimEvaluate(checked.trace, None, None, params.slo, span, rate_factor=checked.rate_factor)  # type: ignore[arg-type]
    replayed = ev.workload(traffic.planning_rps, 0).column("arrival_s").to_numpy()
    whole = scale_rate(trace, traffic.planning_rps).column("arrival_s").to_numpy()
    assert np.diff(replayed) == pytest.approx(np.diff(whole[3000:4000]))  # the gaps those requests have in the whole


def test_a_span_too_short_to_judge_a_target_is_refused():
    with pytest.raises(ValueError, match="whole_trace_max_requests 100: a busiest span of fewer than 1,000"):
        SizeParams(whole_trace_max_requests=100)
