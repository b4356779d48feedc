"""The replay stage's check (llmcap.replaycheck.check_replay) against the real vLLM CPU engine: a small excerpt
at 0.8x / 1.0x / 1.2x of the rate the simulator predicts for it. Every request is accounted for, the per-bucket
table and the verdict are produced. Accuracy is not judged here: that is the reconciliation rule's job (issue 18).

Budget: 20 requests per rate, three rates (a few minutes in all at the tiny model's rates, once the session's
`calibration` exists)."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.config import ReplayParams
from llmcap.replaycheck import check_replay
from llmcap.replaycheck.runs import RECORD_SCHEMA, plan_runs, predict
from llmcap.replaycheck.share import Share
from llmcap.sim import SimConfig
from llmcap.sizing.params import SloParams
from llmcap.sizing.slo import attainment
from llmcap.trace.synth import mean_rate
from tests.live._calibration import azure_workload, engine_config

pytestmark = pytest.mark.live

REQUESTS = 20
SLO = SloParams(ttft_ms=1000, ttft_ms_per_1k_isl=500, itl_ms=200, warmup_frac=0.1, drain_frac=0.1)


def _round_robin(trace, rate: float) -> Share:
    """The unit's share of the trace at `rate` req/s: a round robin over the trace's rate / `rate` instances."""
    return Share(planning_rps=mean_rate(trace), instances_per_unit_rate=mean_rate(trace) / rate)


def _predicted_max_rate(trace, prediction, lo: float = 0.2, hi: float = 50.0) -> float:
    """The simulator's max feasible rate of this excerpt (bisection on the rate): the rate the check scales."""
    for _ in range(12):
        mid = (lo * hi) ** 0.5
        (run,) = plan_runs(trace, _round_robin(trace, mid), 1.0, [1.0], [0], REQUESTS)  # seed 0's, as the check's
        lo, hi = (mid, hi) if attainment(predict(run, *prediction), SLO) >= SLO.attainment_target else (lo, mid)
    return lo


def test_replay_check_against_the_real_engine(vllm_engine, calibration) -> None:
    trace = azure_workload(vllm_engine.kv.max_model_len)
    prediction = (SimConfig(engine=engine_config(vllm_engine)), calibration.fit.model, None)
    rate = _predicted_max_rate(trace, prediction)
    params = ReplayParams(
        excerpt_requests=REQUESTS, isl_buckets=[512, 2048], osl_buckets=[16], timeout_s=60, max_drain_s=30
    )
    check = check_replay(
        trace, _round_robin(trace, rate), 1.0, prediction, vllm_engine.base_url, vllm_engine.model, params, SLO
    )

    m, p, s = check.measured, check.predicted, check.summary
    # every request sent is one row, once, with a status; the prediction holds the same requests
    assert m.schema.equals(RECORD_SCHEMA) and p.schema.equals(RECORD_SCHEMA)
    assert m.num_rows == p.num_rows == 3 * REQUESTS == s["requests_sent"]
    keys = lambda t: list(zip(t.column("run").to_pylist(), t.column("request_id").to_pylist(), strict=True))  # noqa: E731
    assert keys(m) == keys(p) and len(set(keys(m))) == m.num_rows
    assert set(m.column("status").to_pylist()) <= {"ok", "unfinished", "rejected"}
    assert [r["measured"]["requests"] for r in s["runs"]] == [REQUESTS] * 3
    assert sum(sum(r["measured"]["status"].values()) for r in s["runs"]) == m.num_rows

    # the per-bucket table: every ok request counted once per side, percentiles where a bucket has requests
    assert sum(b["n_measured"] for b in s["buckets"]) == sum(r["measured"]["status"]["ok"] for r in s["runs"])
    assert sum(b["n_predicted"] for b in s["buckets"]) == sum(r["predicted"]["status"]["ok"] for r in s["runs"])
    for b in s["buckets"]:
        if b["n_measured"]:
            assert b["ttft_p50_measured_ms"] is not None and b["ttft_p50_measured_ms"] <= b["ttft_p99_measured_ms"]

    # the verdict is computed on both sides (whatever it says: accuracy is issue 18's rule)
    for side in ("measured", "predicted"):
        v = s["verdict"][side]
        assert set(v["holds"]) == {"0.8x", "1x", "1.2x"} and isinstance(v["knee_in_band"], bool)
    print(
        f"\n[live] replay check at {rate:.3g} req/s predicted max: measured {s['verdict']['measured']['text']}; "
        f"predicted {s['verdict']['predicted']['text']}; attainment "
        f"{[(r['run'], r['measured']['attainment'], r['predicted']['attainment']) for r in s['runs']]}; "
        f"lateness p99 {[r['measured']['send_lateness_ms']['p99'] for r in s['runs']]} ms"
    )
    assert np.isfinite(rate) and rate > 0
