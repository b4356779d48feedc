"""Qualification, attainment, goodput and windows on hand-made request sets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmcap.errors import LlmcapError
from llmcap.sizing.params import DistributionTarget, SloParams
from llmcap.sizing.slo import (
    Window,
    attainment,
    distribution_checks,
    goodput,
    percentile_with_inf,
    qualifies,
    steady_window,
)

SLO = SloParams(ttft_ms=200, itl_ms=50, itl_stat="p99", tpot_ms=40, e2e_ms=1000, max_queue_ms=100)


def test_a_request_missing_exactly_one_slo_does_not_count(records):
    good = {"arrival_s": 0.0, "ttft_ms": 150, "itl_ms": 30, "tpot_ms": 30, "e2e_ms": 800, "queue_ms": 50}
    rows = [good]
    for field, bad in [("ttft_ms", 201), ("itl_p99_ms", 51), ("tpot_ms", 41), ("e2e_ms", 1001), ("queue_ms", 101)]:
        rows.append({**good, field: bad})
    q = qualifies(records(rows), SLO)
    assert q.tolist() == [True, False, False, False, False, False]


def test_targets_are_inclusive_and_unset_targets_are_ignored(records):
    exact = {"arrival_s": 0.0, "ttft_ms": 200, "itl_ms": 50, "tpot_ms": 40, "e2e_ms": 1000, "queue_ms": 100}
    assert qualifies(records([exact]), SLO).tolist() == [True]
    only_ttft = SloParams(ttft_ms=200, itl_ms=None)
    slow_tokens = {"arrival_s": 0.0, "ttft_ms": 100, "itl_ms": 10_000, "e2e_ms": 99_000}
    assert qualifies(records([slow_tokens]), only_ttft).tolist() == [True]


def test_itl_statistic_selects_the_per_request_column(records):
    # median gap 20 ms, P99 gap 60 ms, largest 90 ms; target 50 ms
    r = records([{"arrival_s": 0.0, "itl_ms": 20, "itl_p99_ms": 60, "itl_max_ms": 90, "tpot_ms": 20}])
    got = {
        stat: bool(qualifies(r, SloParams(ttft_ms=None, itl_ms=50, itl_stat=stat))[0]) for stat in ("p50", "p99", "max")
    }
    assert got == {"p50": True, "p99": False, "max": False}


def test_unfinished_and_rejected_never_qualify_even_without_targets(records):
    r = records(
        [{"arrival_s": 0.0}, {"arrival_s": 0.1, "status": "unfinished"}, {"arrival_s": 0.2, "status": "rejected"}]
    )
    no_targets = SloParams(ttft_ms=None, itl_ms=None)
    assert qualifies(r, no_targets).tolist() == [True, False, False]
    assert attainment(r, no_targets) == pytest.approx(1 / 3)


def test_one_token_request_has_no_gaps_to_violate(records):
    r = records([{"arrival_s": 0.0, "osl": 1, "itl_ms": None, "tpot_ms": None}])
    assert qualifies(r, SLO).tolist() == [True]


def test_steady_window_definition():
    a = np.array([0.0, 1.0, 2.0, 3.0, 9.0, 10.0])  # span 10 s
    w = steady_window(a, warmup_s=2.0, drain_s=1.0)
    assert (w.start_s, w.end_s, w.closed_end) == (2.0, 9.0, False)
    assert w.mask(a).tolist() == [False, False, True, True, False, False]  # 9.0 is in the drain: half-open
    # No drain: the window is closed, the last arrival counts.
    w0 = steady_window(a, warmup_s=2.0)
    assert w0.closed_end and w0.mask(a).tolist() == [False, False, True, True, True, True]
    # Fractions of the span: max(1 s, 0.25 × 10 s) = 2.5 s warm-up, max(0, 0.2 × 10) = 2 s drain → [2.5, 8).
    wf = steady_window(a, warmup_s=1.0, warmup_frac=0.25, drain_frac=0.2)
    assert (wf.start_s, wf.end_s) == (2.5, 8.0)
    assert wf.mask(a).tolist() == [False, False, False, True, False, False]
    with pytest.raises(LlmcapError):
        steady_window(a, warmup_s=6.0, drain_s=4.0)


def test_window_is_relative_to_the_first_arrival():
    a = np.array([100.0, 104.0, 110.0])
    w = steady_window(a, warmup_s=3.0)
    assert (w.start_s, w.end_s) == (103.0, 110.0)


def test_attainment_and_goodput_exclude_warmup_and_count_unfinished_as_failure(records):
    rows = [
        {"arrival_s": 0.0, "ttft_ms": 5000},  # fails, but in warm-up: not measured
        {"arrival_s": 1.0, "ttft_ms": 5000},  # fails, in warm-up
        {"arrival_s": 2.0},
        {"arrival_s": 3.0},
        {"arrival_s": 4.0, "status": "unfinished"},  # arrived in the window, never finished: failure
        {"arrival_s": 5.0},
        {"arrival_s": 6.0},  # drain
    ]
    slo = SLO.model_copy(update={"warmup_s": 2.0, "drain_s": 1.0})
    r = records(rows)
    # window [2, 5): arrivals 2, 3, 4 → 2 of 3 qualify; length 3 s → goodput 2/3 req/s
    assert attainment(r, slo) == pytest.approx(2 / 3)
    g = goodput(r, slo, gpus=4)
    assert (g.requests, g.qualified) == (3, 2)
    assert g.goodput_rps == pytest.approx(2 / 3)
    assert g.goodput_per_gpu == pytest.approx(2 / 3 / 4)
    assert g.offered_rps == pytest.approx(1.0)
    assert g.misses["status"] == 1 and g.misses["ttft_s"] == 0
    # without a window the two warm-up failures count: 4 of 7 qualify
    assert attainment(r, SLO) == pytest.approx(4 / 7)


def test_explicit_window_and_empty_window(records):
    r = records([{"arrival_s": 0.0}, {"arrival_s": 1.0, "ttft_ms": 999}])
    assert attainment(r, SLO, Window(0.5, 2.0)) == 0.0
    with pytest.raises(LlmcapError):
        attainment(r, SLO, Window(5.0, 6.0))


def test_percentile_with_inf_matches_numpy_on_finite_and_stays_inf():
    v = np.array([3.0, 1.0, 2.0, 4.0])
    for q in (0, 10, 50, 90, 99, 100):
        assert percentile_with_inf(v, q) == pytest.approx(np.percentile(v, q))
    # [1, 2, inf, inf]: P50 rank 1.5 lands between 2 and inf → inf; P25 rank 0.75 → 1 + 0.75 × 1 = 1.75
    w = np.array([1.0, 2.0, math.inf, math.inf])
    assert percentile_with_inf(w, 50) == math.inf
    assert percentile_with_inf(w, 25) == pytest.approx(1.75)
    assert percentile_with_inf(np.array([1.0, math.inf]), 0) == 1.0


def test_distribution_checks_are_across_requests(records):
    # TTFTs 100..1000 ms in steps of 100 → P90 = 100 + 0.9 × 9 × 100 = 910 ms (linear interpolation)
    rows = [{"arrival_s": float(i), "ttft_ms": 100.0 * (i + 1)} for i in range(10)]
    slo = SloParams(
        ttft_ms=None,
        itl_ms=None,
        distribution=(
            DistributionTarget(metric="ttft", percentile=90, target_ms=920),
            DistributionTarget(metric="ttft", percentile=90, target_ms=900),
        ),
    )
    checks = distribution_checks(records(rows), slo)
    assert [c.observed_ms for c in checks] == pytest.approx([910.0, 910.0])
    assert [c.ok for c in checks] == [True, False]
    # an unfinished request is +inf: with 2 of 10 unfinished the P90 TTFT is inf
    rows[8]["status"] = rows[9]["status"] = "unfinished"
    (c, _) = distribution_checks(records(rows), slo)
    assert c.observed_ms == math.inf and not c.ok and c.requests == 10
