"""Workload statistics on small traces whose answers are computed by hand."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from llmcap.config import CharacteriseParams
from llmcap.trace import schema
from llmcap.trace.stats import (
    characterise,
    interarrival_cv,
    joint_distribution,
    length_buckets,
    window_counts,
    window_rates,
)


def table(arrival, isl, osl, **labels) -> pa.Table:
    n = len(arrival)
    cols = {
        "request_id": pa.array(np.arange(n)),
        "arrival_s": pa.array(np.asarray(arrival, float)),
        "isl": pa.array(np.asarray(isl, np.int64)),
        "osl": pa.array(np.asarray(osl, np.int64)),
        "max_tokens": pa.nulls(n, pa.int64()),
        "priority": pa.nulls(n, pa.int64()),
        "hash_ids": pa.nulls(n, pa.list_(pa.int64())),
        "prefix_hit_tokens": pa.nulls(n, pa.int64()),
        **{k: pa.array(labels.get(k, [None] * n), pa.string()) for k in schema.LABEL_COLUMNS},
        "deadline_s": pa.nulls(n, pa.float64()),
        "source_row": pa.array(np.arange(n)),
    }
    return pa.table(cols, schema=schema.CANONICAL_SCHEMA)


def test_window_counts_drop_partial_last_window() -> None:
    arrivals = np.array([0.0, 0.5, 1.2, 1.9, 2.5, 3.7])  # windows [0,1) [1,2) [2,3) full; [3,3.7] partial
    assert window_counts(arrivals, 1.0).tolist() == [2, 2, 1]
    assert window_counts(arrivals, 10.0).tolist() == []


def test_window_rates_burstiness() -> None:
    arrivals = np.array([0.0, 0.5, 1.2, 1.9, 2.5, 3.7])
    r = window_rates(arrivals, 1.0, [50, 100])
    # counts [2,2,1]: mean 5/3, var (1/9+1/9+4/9)/3 = 2/9
    assert r["windows"] == 3 and r["p50"] == 2.0 and r["p100"] == 2.0 and r["max"] == 2.0
    assert r["cv"] == pytest.approx(np.sqrt(2 / 9) / (5 / 3))
    assert r["index_of_dispersion"] == pytest.approx((2 / 9) / (5 / 3))
    assert r["peak_to_mean"] == pytest.approx(2 / (5 / 3))


def test_interarrival_cv_includes_zero_gaps() -> None:
    # gaps [0, 2]: mean 1, population std 1 → CV 1
    assert interarrival_cv(np.array([0.0, 0.0, 2.0])) == pytest.approx(1.0)
    assert interarrival_cv(np.array([5.0])) is None


def test_length_buckets_and_joint_counts() -> None:
    assert length_buckets(1000, 2.0).tolist() == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    j = joint_distribution(np.array([1, 3, 3, 700]), np.array([1, 1, 5, 9]), 2.0)
    counts = np.array(j["counts"])
    assert counts.sum() == 4
    assert counts[0, 0] == 1  # (1, 1): ISL [1,2) × OSL [1,2)
    assert counts[1, 0] == 1 and counts[1, 2] == 1  # ISL 3 ∈ [2,4); OSL 1 and 5 ∈ [4,8)
    assert counts[9, 3] == 1  # ISL 700 ∈ [512,1024), OSL 9 ∈ [8,16)


def test_characterise_summary_on_a_small_trace() -> None:
    t = table([0, 1, 2, 3, 4], [10, 20, 30, 40, 50], [5, 4, 3, 2, 1], model=["a", "a", "b", None, "a"])
    s = characterise(t, CharacteriseParams(rps_windows_s=[1], percentiles=[50], lru_cache_blocks=[]))
    assert (s["rows"], s["duration_s"], s["mean_rps"]) == (5, 4.0, 1.25)
    assert s["isl"] == {"mean": 30.0, "p50": 30.0, "min": 10.0, "max": 50.0}
    assert s["corr_pearson"] == pytest.approx(-1.0) and s["corr_spearman"] == pytest.approx(-1.0)
    assert s["interarrival_cv"] == 0.0
    assert s["rps_windows"]["1s"]["windows"] == 4 and s["rps_windows"]["1s"]["cv"] == 0.0
    assert s["mix"] == {"model": {"a": 0.6, "(none)": 0.2, "b": 0.2}}
    assert "prefix" not in s
