"""Measured beside predicted, bucket by bucket (llmcap.replaycheck.compare.bucket_table) and run by run
(run_summary), on hand-made records whose percentiles are worked out here."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import yaml

from llmcap.replaycheck.compare import bucket_labels, bucket_of, bucket_table, run_summary
from llmcap.sizing.params import SloParams
from tests.sizing.conftest import make_records


def side(rows: list[tuple[str, int, int, float, float, str]]) -> pa.Table:
    """(run, isl, osl, ttft ms, tpot ms, status) rows as records with a `run` column."""
    t = make_records(
        [
            {
                "arrival_s": float(i),
                "isl": isl,
                "osl": osl,
                "ttft_ms": ttft,
                "tpot_ms": tpot,
                "itl_ms": tpot,
                "status": st,
            }
            for i, (_, isl, osl, ttft, tpot, st) in enumerate(rows)
        ]
    )
    return t.append_column("run", pa.array([r[0] for r in rows]))


def test_bucket_labels_and_membership() -> None:
    assert bucket_labels([4096, 16384]) == ["<4096", "4096-16383", ">=16384"] and bucket_labels([]) == ["all"]
    assert bucket_of(np.array([0, 4095, 4096, 16383, 16384]), [4096, 16384]).tolist() == [
        "<4096",
        "<4096",
        "4096-16383",
        "4096-16383",
        ">=16384",
    ]


def test_each_bucket_has_both_sides_percentiles_and_counts() -> None:
    measured = side(
        [
            ("0.8x", 100, 10, 100.0, 20.0, "ok"),
            ("0.8x", 100, 10, 200.0, 40.0, "ok"),
            ("0.8x", 100, 10, 300.0, 60.0, "ok"),
            ("0.8x", 5000, 10, 900.0, 10.0, "ok"),
            ("0.8x", 100, 10, 0.0, 0.0, "rejected"),
            ("1.2x", 100, 500, 50.0, 5.0, "ok"),
        ]
    )
    predicted = side(
        [("0.8x", 100, 10, 150.0, 30.0, "ok"), ("1.2x", 100, 500, 60.0, 6.0, "ok"), ("1.2x", 9000, 10, 70.0, 7.0, "ok")]
    )
    rows = bucket_table(measured, predicted, [4096], [256], ["0.8x", "1.2x"])
    keys = [(r["run"], r["isl_bucket"], r["osl_bucket"]) for r in rows]
    assert keys == [
        ("0.8x", "<4096", "<256"),
        ("0.8x", ">=4096", "<256"),
        ("1.2x", "<4096", ">=256"),
        ("1.2x", ">=4096", "<256"),
    ]
    first = rows[0]
    assert (first["n_measured"], first["n_predicted"]) == (3, 1)  # the rejected request is no latency
    # percentiles of 100/200/300 ms by linear interpolation: p50 200, p90 280, p99 298
    assert [first[f"ttft_p{q}_measured_ms"] for q in (50, 90, 99)] == pytest.approx([200.0, 280.0, 298.0])
    assert [first[f"itl_p{q}_measured_ms"] for q in (50, 90, 99)] == pytest.approx([40.0, 56.0, 59.6])
    assert [first[f"ttft_p{q}_predicted_ms"] for q in (50, 90, 99)] == pytest.approx([150.0] * 3)
    assert (
        rows[1]["n_predicted"] == 0
        and rows[1]["ttft_p50_predicted_ms"] is None
        and rows[1]["ttft_p99_measured_ms"] == pytest.approx(900.0)
    )
    assert (
        rows[3]["n_measured"] == 0
        and rows[3]["itl_p90_measured_ms"] is None
        and rows[3]["itl_p90_predicted_ms"] == pytest.approx(7.0)
    )


def test_a_runs_summary_counts_statuses_and_its_steady_window() -> None:
    rows = [{"arrival_s": float(t), "ttft_ms": 100.0 if t % 5 else 3000.0} for t in range(20)] + [
        {"arrival_s": 20.0, "status": "unfinished"}
    ]
    s = run_summary(make_records(rows), SloParams(ttft_ms=2000, itl_ms=None, warmup_frac=0.1, drain_frac=0.1))
    assert s["requests"] == 21 and s["status"] == {"ok": 20, "unfinished": 1, "rejected": 0}
    # steady window: arrivals 0..20 s less 10% warm-up and 10% drain, [2, 18): 16 requests, 3 of them slow (5, 10, 15)
    assert s["judged"] == 16 and s["met"] == 13 and s["attainment"] == pytest.approx(13 / 16)
    empty = run_summary(make_records([]).slice(0, 0), SloParams(ttft_ms=2000))
    assert empty["requests"] == 0 and empty["attainment"] is None and empty["judged"] == 0 and empty["met"] == 0
    assert empty["status"] == {"ok": 0, "unfinished": 0, "rejected": 0}


def test_rows_come_in_run_then_bucket_order_in_plain_values() -> None:
    # runs in scale order (1x before 1.2x, though "1.2x" < "1x" as text) and buckets from short to long ("4096-16383"
    # sorts before "<4096" as text)
    rows_in = [
        ("1.2x", 100, 10, 50.0, 5.0, "ok"),
        ("1x", 5000, 10, 60.0, 6.0, "ok"),
        ("1x", 100, 10, 70.0, 7.0, "ok"),
        ("0.8x", 20000, 10, 80.0, 8.0, "ok"),
    ]
    rows = bucket_table(side(rows_in), side(rows_in), [4096, 16384], [], ["0.8x", "1x", "1.2x"])
    assert [(r["run"], r["isl_bucket"], r["osl_bucket"]) for r in rows] == [
        ("0.8x", ">=16384", "all"),
        ("1x", "<4096", "all"),
        ("1x", "4096-16383", "all"),
        ("1.2x", "<4096", "all"),
    ]
    # what the replay summary writes: plain str / int / float, so any YAML or JSON writer takes them as they are
    assert yaml.safe_load(yaml.safe_dump(rows)) == rows


def test_requests_without_an_itl_have_no_itl_percentiles() -> None:
    # one output token: no gap, so no TPOT (NaN); TTFT percentiles are still there
    single = side([("1x", 100, 1, 100.0, None, "ok"), ("1x", 100, 1, 300.0, None, "ok")])
    (row,) = bucket_table(single, single, [], [], ["1x"])
    assert [row[f"itl_p{q}_measured_ms"] for q in (50, 90, 99)] == [None, None, None]
    assert [row[f"ttft_p{q}_measured_ms"] for q in (50, 90, 99)] == pytest.approx([200.0, 280.0, 298.0])
