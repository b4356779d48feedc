"""`with_client_latency`: simulated records as a client a constant latency away sees them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from llmcap.perf.model import LinearStepModel
from llmcap.sim import EngineConfig, SimConfig, simulate
from llmcap.sim.records import REQUEST_SCHEMA, with_client_latency

SHIFTED = ("first_token_s", "finish_s", "ttft_s", "e2e_s")


def _records() -> pa.Table:
    trace = pa.table({"arrival_s": [0.0, 0.001, 0.5], "isl": [300, 40, 900], "osl": [5, 1, 12]})
    model = LinearStepModel(overhead_s=2e-3, per_prefill_token_s=1e-5, per_decode_seq_s=1e-4)
    # a run cut short leaves the last request unfinished: its nulls must stay null
    return simulate(trace, model, SimConfig(engine=EngineConfig(num_blocks=64), max_time_s=0.505)).records


def test_shifts_visibility_times_and_leaves_engine_times_and_gaps_alone():
    rec = _records()
    assert rec.column("status").to_pylist() == ["ok", "ok", "unfinished"]
    d = 0.0125
    out = with_client_latency(rec, d)
    assert out.schema.equals(REQUEST_SCHEMA)
    for name in REQUEST_SCHEMA.names:
        before, after = rec.column(name).to_pylist(), out.column(name).to_pylist()
        if name in SHIFTED:
            assert [None if b is None else b + d for b in before] == pytest.approx(after, abs=1e-15), name
        else:
            assert before == after, name
    # the defining identities still hold on the client's clock
    a = out.column("arrival_s").to_numpy()
    ft = out.column("first_token_s").to_numpy(zero_copy_only=False).astype(float)
    ttft = out.column("ttft_s").to_numpy(zero_copy_only=False).astype(float)
    ok = ~np.isnan(ft)
    assert np.allclose(ft[ok] - a[ok], ttft[ok])
    # one-token request: no gaps, ITL/TPOT stay null
    assert out.column("itl_p50_s").to_pylist()[1] is None and out.column("tpot_s").to_pylist()[1] is None


def test_zero_latency_is_the_identity_and_bad_latency_is_refused():
    rec = _records()
    assert with_client_latency(rec, 0.0).equals(rec)
    for bad in (-1e-3, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            with_client_latency(rec, bad)
