"""Analytic demand, the worked example of docs/domain.md, and the pruning bounds (hand-computed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmcap.errors import LlmcapError
from llmcap.sizing.analytic import (
    ceil_count,
    decode_tokens_s_bound,
    demand,
    demand_growth,
    pd_initial_sizing,
    peak_to_mean,
    rate_bounds,
    replicas_for,
    windowed_peak_rate,
    worth_simulating,
)


def test_design_worked_example():
    # λ = 12 req/s; P = TP2 at 4 req/s, H_P = 1.25: ceil(12 × 1.25 / 4) = ceil(3.75) = 4 → 8 GPUs
    # D = TP4 at 7 req/s, H_D = 1.20: ceil(12 × 1.2 / 7) = ceil(2.057) = 3 → 12 GPUs; total 20
    s = pd_initial_sizing(12, prefill_rps=4, prefill_gpus=2, decode_rps=7, decode_gpus=4, h_prefill=1.25, h_decode=1.20)
    assert (s.prefill.instances, s.decode.instances, s.gpus) == (4, 3, 20)
    assert (s.prefill.gpus, s.decode.gpus) == (8, 12)
    assert "ceil(3.75)" in s.prefill.reasoning


def test_ceil_ignores_float_dust_but_not_real_fractions():
    assert 0.1 * 3 / 0.1 > 3  # 3.0000000000000004: the dust this guards against
    assert ceil_count(0.1 * 3 / 0.1) == 3
    assert ceil_count(3.001) == 4
    assert ceil_count(0.0) == 0
    assert replicas_for(10, 5, 2).instances == 2
    with pytest.raises(LlmcapError):
        replicas_for(10, 0, 2)


def test_demand_ledgers():
    # two requests: (ISL 100, OSL 2, 40 cached) and (ISL 300, OSL 4, 0 cached); λ = 10, TPOT = 0.01 s
    d = demand(
        10.0,
        isl=[100, 300],
        osl=[2, 4],
        tpot_s=0.01,
        kv_bytes_per_token=1000.0,
        cached_tokens=[40, 0],
        peak_rate_rps=25.0,
        kv_tokens_per_instance=50.0,
        instances=2,
    )
    assert d.prefill_tokens_s == pytest.approx(10 * (60 + 300) / 2)  # 1800
    assert d.decode_tokens_s == pytest.approx(10 * 3)  # E[OSL] = 3
    assert d.active_sequences == pytest.approx(10 * 0.01 * 3)  # Little: λ · OSL · TPOT = 0.3
    # token-seconds: 0.01 × (OSL·ISL + OSL(OSL+1)/2): r1 = 0.01 × (200 + 3) = 2.03; r2 = 0.01 × (1200 + 10) = 12.1
    assert d.active_tokens == pytest.approx(10 * (2.03 + 12.1) / 2)  # 70.65
    assert d.kv_bytes == pytest.approx(70.65 * 1000)
    assert d.kv_budget_tokens == 100.0 and d.kv_utilisation == pytest.approx(0.7065)
    assert d.payload_bytes_mean == pytest.approx(1000 * 200)  # E[ISL] = 200 tokens of KV
    assert d.pd_bandwidth_avg_bytes_s == pytest.approx(10 * 200_000)
    assert d.pd_bandwidth_burst_bytes_s == pytest.approx(25 * 200_000)
    with pytest.raises(LlmcapError):
        demand(1.0, [1, 2], [1], 0.01, 1.0)


def test_demand_uses_joint_pairs_not_marginals():
    # same marginals, opposite pairing: long prompts with long answers hold more KV
    a = demand(1.0, isl=[100, 1000], osl=[10, 100], tpot_s=0.01, kv_bytes_per_token=1.0)
    b = demand(1.0, isl=[100, 1000], osl=[100, 10], tpot_s=0.01, kv_bytes_per_token=1.0)
    # a: 0.01 × ((1000 + 55) + (100000 + 5050)) / 2 = 530.525; b: 0.01 × ((10000 + 5050) + (10000 + 55)) / 2 = 125.525
    assert (a.active_tokens, b.active_tokens) == pytest.approx((530.525, 125.525))


def test_windowed_peak_ramp_and_peak_to_mean():
    # 10 s windows from the first arrival (t = 0): counts [2, 6, 4] (the arrival at 30 s starts a partial window, dropped)
    arr = np.r_[[0, 2], np.linspace(10, 19, 6), [20, 21, 22, 23], [30]].astype(float)
    assert windowed_peak_rate(arr, 10.0) == pytest.approx(0.6)
    assert peak_to_mean(arr, 10.0) == pytest.approx(6 / 4)
    # rates [0.2, 0.6, 0.4]: within one window the largest rise is 0.6 − 0.2 = 0.4 req/s; within two windows
    # the lag-2 rise 0.4 − 0.2 = 0.2 does not beat it; a falling trace has no rise at all
    assert demand_growth(arr, 10.0, 10.0) == pytest.approx(0.4)
    assert demand_growth(arr, 10.0, 25.0) == pytest.approx(0.4)
    assert demand_growth(arr[::-1].copy(), 10.0, 10.0) == pytest.approx(0.4)  # order of input does not matter
    assert demand_growth(np.r_[np.linspace(0, 9, 6), [10, 15], [20]], 10.0, 10.0) == 0.0  # rates [0.6, 0.2]
    # no full window: fall back to n / span (peak) and 1 (ratio)
    assert windowed_peak_rate([0.0, 1.0, 2.0], 10.0) == pytest.approx(1.5)
    assert peak_to_mean([0.0, 1.0], 10.0) == 1.0


def test_rate_bounds_and_binding_resource():
    # E[uncached ISL] = (1000 - 200 + 3000) / 2 = 1900; E[OSL] = 200
    b = rate_bounds(
        isl=[1000, 3000],
        osl=[100, 300],
        cached_tokens=[200, 0],
        prefill_tokens_s=19_000,
        decode_tokens_s=4_000,
        kv_tokens=2e4,
        min_tpot_s=0.01,
    )
    assert b.prefill_compute == pytest.approx(10.0)
    assert b.decode_bandwidth == pytest.approx(20.0)
    # token-seconds: 0.01 × mean(100·1000 + 5050, 300·3000 + 45150) = 0.01 × 525100 = 5251
    assert b.kv == pytest.approx(2e4 / 5251)  # 3.81 req/s: below 10 and 20
    assert b.rate == pytest.approx(2e4 / 5251) and b.binding == "kv"


def test_decode_bandwidth_bound():
    # B = 64, W = 10 GB, 100 kB/token KV, ctx 1000, 2 TB/s: step ≥ (1e10 + 64·1000·1e5)/2e12 = 8.2 ms → 64/0.0082 tok/s
    got = decode_tokens_s_bound(64, 1e10, 1e5, 1000, 2e12)
    assert got == pytest.approx(64 / ((1e10 + 6.4e9) / 2e12))
    assert decode_tokens_s_bound(128, 1e10, 1e5, 1000, 2e12) > got  # bigger batches amortise weights


def test_pruning_rule():
    assert worth_simulating(10.0, 2, None)
    assert worth_simulating(10.0, 2, best_goodput_per_gpu=4.9)  # bound 5 per GPU may still win
    assert not worth_simulating(10.0, 2, best_goodput_per_gpu=5.0)  # cannot beat it
    assert not worth_simulating(0.0, 1, None)
    assert math.isinf(rate_bounds([10], [1], 1.0, 1.0, 1.0, 0.0).kv)
