"""The SLO definitions users recognise, on hand-made records: per-request TPOT (mean gap), per-request worst
gap, token-level ITL percentile across all tokens; TTFT with or without the P→D handoff; which one was used."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from llmcap.candidates import EnumerationSpec, enumerate_candidates
from llmcap.catalog import load_model
from llmcap.sim import LinkConfig
from llmcap.sim.records import REQUEST_SCHEMA
from llmcap.sizing.params import SizeParams, SloParams
from llmcap.sizing.scenarios import Judge, Scenario
from llmcap.sizing.search import EvalResult, _feasible
from llmcap.sizing.sizer import PdFactory
from llmcap.sizing.slo import definitions, qualifies, token_itl_check
from llmcap.sizing.units import Lengths, make_unit

# Each request's inter-token gaps in seconds (OSL = gaps + 1): a steady one, one long stall, many small gaps.
GAPS = [
    [0.02, 0.02, 0.02, 0.02],
    [0.01, 0.01, 0.01, 0.30],
    [0.03] * 9,
]


def _records(gaps: list[list[float]]) -> pa.Table:
    """REQUEST_SCHEMA rows whose timestamps and per-request ITL columns follow from `gaps`, as the simulator's do."""
    rows = []
    for i, g in enumerate(gaps):
        v = np.asarray(g)
        first = 1.0 + i
        finish = first + float(v.sum())
        rows.append(
            {name: None for name in REQUEST_SCHEMA.names}
            | dict(
                request_id=i,
                arrival_s=float(i),
                isl=100,
                osl=len(g) + 1,
                cached_tokens=0,
                host_cached_tokens=0,
                preemptions=0,
                status="ok",
                queue_s=0.0,
                ttft_s=first - i,
                first_token_s=first,
                finish_s=finish,
                e2e_s=finish - i,
                tpot_s=(finish - first) / len(g),
                itl_p50_s=float(np.percentile(v, 50)),
                itl_p99_s=float(np.percentile(v, 99)),
                itl_max_s=float(v.max()),
            )
        )
    return pa.Table.from_pylist(rows, schema=REQUEST_SCHEMA)


@pytest.mark.parametrize("target_ms", [25.0, 75.0, 100.0])
def test_mean_is_the_requests_tpot(target_ms):
    got = qualifies(_records(GAPS), SloParams(ttft_ms=None, itl_ms=target_ms, itl_stat="mean"))
    want = [sum(g) / len(g) <= target_ms / 1e3 for g in GAPS]  # mean gap = (last − first token) / (OSL − 1)
    assert got.tolist() == want


@pytest.mark.parametrize("target_ms", [25.0, 31.0, 300.0])
def test_max_is_the_requests_worst_gap(target_ms):
    got = qualifies(_records(GAPS), SloParams(ttft_ms=None, itl_ms=target_ms, itl_stat="max"))
    assert got.tolist() == [max(g) <= target_ms / 1e3 for g in GAPS]


def test_tpot_and_mean_itl_bound_one_column_by_the_tighter_target():
    rec = _records(GAPS)
    both = qualifies(rec, SloParams(ttft_ms=None, itl_ms=90, itl_stat="mean", tpot_ms=25))
    assert both.tolist() == [sum(g) / len(g) <= 0.025 for g in GAPS]


@pytest.mark.parametrize("stat", ["token_p50", "token_p90", "token_p99"])
def test_token_level_percentile_pools_every_gap_of_every_request(stat):
    q = float(stat.removeprefix("token_p"))
    # the simulator's (value, weight) form: equal gaps of a request folded into one weighted value
    values = np.array([0.02, 0.01, 0.30, 0.03])
    weights = np.array([4, 3, 1, 9])
    every_gap = np.concatenate(GAPS)
    want_ms = float(np.percentile(every_gap, q, method="inverted_cdf")) * 1e3
    for target, ok in ((want_ms, True), (want_ms * 0.99, False)):
        check = token_itl_check(values, weights, SloParams(ttft_ms=None, itl_ms=target, itl_stat=stat))
        assert check is not None and check.requests == every_gap.size
        assert check.observed_ms == pytest.approx(want_ms) and check.ok is ok


def test_token_level_target_is_no_per_request_target():
    # 17 gaps, one of them 300 ms: P90 across tokens is 30 ms, though request 1's worst gap is 300 ms
    slo = SloParams(ttft_ms=None, itl_ms=50, itl_stat="token_p90")
    assert qualifies(_records(GAPS), slo).all()
    assert token_itl_check(np.concatenate(GAPS), np.ones(17, dtype=np.int64), slo).ok
    assert (
        token_itl_check(np.zeros(0), np.zeros(0, dtype=np.int64), SloParams(itl_stat="p99")) is None
    )  # per-request: no run check


def test_a_run_level_miss_fails_the_rate_and_the_scenario_whatever_the_attainment():
    good, missed = EvalResult(1.0), EvalResult(1.0, run_miss="ITL token-level P99 120 ms > 100 ms")
    assert _feasible([good, good], 0.99, "all_seeds") and not _feasible([good, missed], 0.99, "mean")
    judge = Judge(0.99, 0.9, "decode", "prefill")
    verdict = judge(Scenario("traffic", (("prefill", 2), ("decode", 1)), "all"), missed)
    assert not verdict.passed and verdict.blame == "decode" and "token-level" in verdict.describe()


def test_definitions_name_the_itl_statistic_and_the_handoff():
    pd_in = definitions(SloParams(itl_stat="token_p99"), disaggregated=True)
    assert "token-level P99" in pd_in["itl"] and "after the P→D KV handoff" in pd_in["ttft"]
    pd_out = definitions(SloParams(itl_stat="max", ttft_includes_handoff=False), disaggregated=True)
    assert "worst inter-token gap" in pd_out["itl"] and "handoff not included" in pd_out["ttft"]
    agg = definitions(SloParams(itl_stat="mean", tpot_ms=40, e2e_ms=9000), disaggregated=False)
    assert (
        "handoff" not in agg["ttft"]
        and "TPOT" in agg["itl"]
        and set(agg) == {"ttft", "itl", "tpot", "e2el", "attainment"}
    )


@pytest.fixture(scope="module")
def pd_units():
    model = load_model("Llama-3.1-8B")
    spec = EnumerationSpec(
        gpus=["h100"],
        weight_quants=["fp8"],
        kv_dtypes=["fp8"],
        parallel={"tp": [1]},
        modes=["disaggregated"],
        max_context_len=8192,
    )
    rows = enumerate_candidates(model, spec).table
    rows = rows[rows["feasible"]]
    rng = np.random.default_rng(0)
    trace = pa.table(
        {
            "arrival_s": np.sort(rng.uniform(0, 60, 120)),
            "isl": rng.integers(500, 4000, 120),
            "osl": rng.integers(2, 200, 120),
        }
    )
    lengths = Lengths.of(trace)
    unit = {
        role: make_unit(model, rows[rows["role"] == role].iloc[0], lengths, SloParams())
        for role in ("prefill", "decode")
    }
    return trace, unit


@pytest.mark.parametrize("includes", [True, False])
def test_pd_ttft_includes_the_handoff_by_default(pd_units, includes):
    trace, unit = pd_units
    params = SizeParams(slo=SloParams(ttft_includes_handoff=includes))
    assert SizeParams().slo.ttft_includes_handoff  # the default: the first token the user sees
    link = LinkConfig(bandwidth_bytes_s=1e9, latency_s=0.01)  # a slow link: the handoff is visible
    rec = PdFactory(trace, unit["prefill"], unit["decode"], link, params)(1, 1).simulate(2.0, 0).records
    col = {
        c: rec.column(c).to_numpy(zero_copy_only=False).astype(float)
        for c in ("ttft_s", "queue_s", "prefill_s", "visible_wait_s")
    }
    at_prefill = col["queue_s"] + col["prefill_s"]
    handoff = col["visible_wait_s"]
    assert handoff.min() > 0.01
    want = at_prefill + handoff if includes else at_prefill
    np.testing.assert_allclose(col["ttft_s"], want, rtol=0, atol=1e-9)
