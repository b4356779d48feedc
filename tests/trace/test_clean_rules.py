"""Cleaning's rules one at a time, on hand-made `RawTrace`s fed straight to `clean_trace` (no reader in the
way): each rule just inside (kept) and just outside (quarantined, with its reason and detail text), the
report's every field, the schemas and metadata written, the log line, and the warnings' limits.
Complements test_clean_accounting.py (the same rules read from a CSV file)."""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from llmcap.errors import LlmcapError
from llmcap.trace import schema
from llmcap.trace.clean import clean_trace
from llmcap.trace.params import CleanParams, ExcludeRule
from llmcap.trace.readers import RawTrace

NAN, INF = math.nan, math.inf


def _raw(arrival, isl, osl, *, labels=None, parse_error=None, **kw) -> RawTrace:
    n = len(arrival)
    errors = np.full(n, None, dtype=object)
    for row, why in (parse_error or {}).items():
        errors[row] = why
    return RawTrace(
        path=Path("/somewhere/hand.csv"),
        format="csv",
        arrival_s=np.array(arrival, dtype=float),
        isl=np.array(isl, dtype=float),
        osl=np.array(osl, dtype=float),
        labels=labels or {},
        source_row=np.arange(n, dtype=np.int64),
        line=np.arange(n, dtype=np.int64) + 2,
        parse_error=errors,
        **kw,
    )


def _reasons(result) -> dict[int, tuple[str, str | None]]:
    q = result.quarantine.to_pydict()
    return {row: (why, detail) for row, why, detail in zip(q["source_row"], q["reason"], q["detail"], strict=True)}


# row: arrival, isl, osl                     rule (max_context_tokens 4096, window [1, 20))
RULES = [
    (2.0, 10, 1),  # 0: kept: osl 1 is the least allowed
    (3.0, INF, 5),  # 1: isl_not_finite
    (4.0, 10, INF),  # 2: osl_not_finite
    (5.0, 10, -3),  # 3: osl_below_1 (an integer, not 0)
    (6.0, 10, 0),  # 4: osl 0: the reader's zero_osl_reason (failed_request)
    (7.0, 4090, 6),  # 5: kept: ISL+OSL = 4096 = max_context_tokens, not above it
    (8.0, 4090, 7),  # 6: exceeds_max_context: 4097 > 4096
    (9.0, 10, 5),  # 7: malformed_record (a parse error wins over everything)
    (NAN, 10, 5),  # 8: invalid_arrival
    (0.999, 10, 5),  # 9: outside_window: before window_start_s 1
    (1.0, 10, 5),  # 10: kept: at window_start_s
    (19.999, 10, 5),  # 11: kept: just before window_end_s 20
    (20.0, 10, 5),  # 12: outside_window: at window_end_s
    (10.0, 10, 5),  # 13: hash_ids_invalid (its hash list is null)
    (11.0, 10, 5),  # 14: test_traffic (tenant matches)
    (12.0, 10, 5),  # 15: kept: its tenant is null, which never matches
]


@pytest.fixture
def rules_result():
    arrival, isl, osl = (list(c) for c in zip(*RULES, strict=True))
    n = len(RULES)
    hashes = [[k] for k in range(n)]
    hashes[13] = None
    tenants = ["prod"] * n
    tenants[14], tenants[15] = "test-1", None
    labels = {
        "hash_ids": pa.array(hashes, pa.list_(pa.int64())),
        "tenant": pa.array(tenants, pa.string()),
        "model": pa.array([f"m{k}" for k in range(n)], pa.string()),
        "deadline_s": pa.array([float(k) for k in range(n)], pa.float64()),
    }
    raw = _raw(
        arrival,
        isl,
        osl,
        labels=labels,
        parse_error={7: "line 9: not valid JSON"},
        zero_osl_reason="failed_request",
        block_size=16,
        start="+100.125s",
        arrival_column="ts",
        arrival_unit="s",
    )
    params = CleanParams(
        max_context_tokens=4096,
        window_start_s=1.0,
        window_end_s=20.0,
        exclude=[ExcludeRule(field="tenant", pattern="test-.*")],
    )
    return clean_trace(raw, params)


def test_each_rule_just_inside_keeps_and_just_outside_quarantines_with_its_detail(rules_result) -> None:
    assert _reasons(rules_result) == {
        1: ("isl_not_finite", "isl=inf"),
        2: ("osl_not_finite", "osl=inf"),
        3: ("osl_below_1", "osl=-3 < 1"),
        4: ("failed_request", "osl=0"),
        6: ("exceeds_max_context", "ISL+OSL=4097 > 4096"),
        7: ("malformed_record", "line 9: not valid JSON"),
        8: ("invalid_arrival", "missing or unparseable arrival time"),
        9: ("outside_window", "before window_start_s=1.0"),
        12: ("outside_window", "at/after window_end_s=20.0"),
        13: ("hash_ids_invalid", "hash_ids missing or not a list of integers"),
        14: ("test_traffic", "tenant matches 'test-.*'"),
    }
    # kept, by arrival: rows 10 (1.0), 0 (2.0), 5 (7.0), 15 (12.0), 11 (19.999)
    assert rules_result.trace.column("source_row").to_pylist() == [10, 0, 5, 15, 11]


def test_the_report_names_every_field(rules_result) -> None:
    assert rules_result.report.as_dict() == {
        "source_file": "hand.csv",
        "source_format": "csv",
        "rows_in": 16,
        "rows_kept": 5,
        "rows_quarantined": 11,
        "by_reason": {
            "malformed_record": 1,
            "invalid_arrival": 1,
            "isl_not_finite": 1,
            "osl_not_finite": 1,
            "failed_request": 1,
            "osl_below_1": 1,
            "hash_ids_invalid": 1,
            "exceeds_max_context": 1,
            "outside_window": 2,
            "test_traffic": 1,
        },
        "out_of_order_rows": 2,  # kept arrivals in file order 2, 7, 1, 19.999, 12: 1 and 12 come after a later one
        "start": "+101.125s",  # the source's +100.125 s plus the first kept arrival, 1.0
        "duration_s": 18.999,  # 19.999 - 1.0
        "block_size": 16,
        "generated_arrivals": False,
        "arrival_column": "ts",
        "arrival_unit": "s",
        "arrival_process": None,
        "duplicates": "by_id",
        "warnings": (),
        "prefix_scope": "",
        "accounting_ok": True,
    }


def test_the_canonical_trace_carries_labels_in_arrival_order_with_schema_and_metadata(rules_result) -> None:
    t = rules_result.trace
    assert t.schema.equals(schema.CANONICAL_SCHEMA) and t.schema.metadata == schema.metadata(
        source_format="csv", source_file="hand.csv", block_size=16, start="+101.125s"
    )
    d = t.to_pydict()
    assert d["request_id"] == [0, 1, 2, 3, 4] and d["arrival_s"] == pytest.approx([0.0, 1.0, 6.0, 11.0, 18.999])
    assert d["isl"] == [10, 10, 4090, 10, 10] and d["osl"] == [5, 1, 6, 5, 5]
    assert d["tenant"] == ["prod", "prod", "prod", None, "prod"] and d["model"] == ["m10", "m0", "m5", "m15", "m11"]
    assert d["deadline_s"] == [10.0, 0.0, 5.0, 15.0, 11.0] and d["hash_ids"] == [[10], [0], [5], [15], [11]]
    assert d["adapter"] == [None] * 5 and d["session"] == [None] * 5
    # block 16: every hash list is distinct, so nothing is reused
    assert d["prefix_hit_tokens"] == [0, 0, 0, 0, 0]


def test_the_quarantine_keeps_the_values_as_read_with_missing_ones_null(rules_result) -> None:
    q = rules_result.quarantine
    assert q.schema.equals(schema.QUARANTINE_SCHEMA)
    d = q.to_pydict()
    at = {row: k for k, row in enumerate(d["source_row"])}
    assert d["arrival_s"][at[8]] is None and d["isl"][at[1]] == INF and d["osl"][at[3]] == -3.0  # NaN read as null
    assert d["model"][at[8]] == "m8" and d["tenant"][at[14]] == "test-1" and d["line"][at[8]] == 10
    assert d["raw"] == [None] * 11  # no raw text was kept for these rows


def test_missing_lengths_and_arrivals_are_null_in_the_quarantine() -> None:
    result = clean_trace(_raw([0.0, 1.0, 2.0, NAN], [NAN, 10, 10, 10], [5, NAN, 5, 5]), CleanParams())
    d = result.quarantine.to_pydict()
    assert d["reason"] == ["isl_missing", "osl_missing", "invalid_arrival"]
    assert d["isl"] == [None, 10.0, 10.0] and d["osl"] == [5.0, None, 5.0] and d["arrival_s"] == [0.0, 1.0, None]
    assert d["model"] == [None] * 3 and d["tenant"] == [None] * 3
    assert result.quarantine.schema.equals(schema.QUARANTINE_SCHEMA)


def test_a_trace_with_no_labels_still_has_the_canonical_schema() -> None:
    # block_size without hash lists: no prefix column to fill
    result = clean_trace(_raw([0.0, 1.0], [10, 20], [5, 6], block_size=64), CleanParams())
    t = result.trace
    assert t.schema.equals(schema.CANONICAL_SCHEMA)
    assert t.column("hash_ids").to_pylist() == [None, None] and t.column("prefix_hit_tokens").to_pylist() == [
        None,
        None,
    ]
    assert t.column("deadline_s").to_pylist() == [None, None] and t.column("tenant").to_pylist() == [None, None]


def test_osl_zero_without_a_reader_reason_is_osl_below_1() -> None:
    result = clean_trace(_raw([0.0, 1.0], [10, 10], [0, 1]), CleanParams())
    assert _reasons(result) == {0: ("osl_below_1", "osl=0")} and result.report.rows_kept == 1


def test_generated_arrivals_are_said_in_the_report_and_the_metadata() -> None:
    raw = _raw([0.0, 0.5], [10, 10], [5, 5], generated_arrivals=True, arrival_process="poisson at 2 req/s, seed 0")
    result = clean_trace(raw, CleanParams())
    r = result.report
    assert (
        r.generated_arrivals is True and r.arrival_process == "poisson at 2 req/s, seed 0" and r.arrival_column is None
    )
    assert result.trace.schema.metadata[b"llmcap.arrivals"] == b"generated"
    assert result.trace.schema.metadata[b"llmcap.block_size"] == b""


def test_nothing_kept_reports_zero_duration_and_no_out_of_order_rows() -> None:
    result = clean_trace(_raw([0.0, 1.0], [NAN, 10], [5, 0]), CleanParams())
    r = result.report
    assert (r.rows_kept, r.duration_s, r.out_of_order_rows, r.start) == (0, 0.0, 0, "+0.000s")


def test_ties_keep_file_order_on_a_large_trace() -> None:
    # 255 rows: 5 at 1 s, 200 at 0 s, 50 at 1 s; a stable sort puts the 200 first, then 0..4, then 205..254
    arrival = [1.0] * 5 + [0.0] * 200 + [1.0] * 50
    result = clean_trace(_raw(arrival, list(range(1, 256)), [5] * 255), CleanParams())
    want = list(range(5, 205)) + list(range(5)) + list(range(205, 255))
    assert result.trace.column("source_row").to_pylist() == want
    assert result.report.out_of_order_rows == 200  # every 0 s row after the first 1 s one


def test_the_log_line_counts_rows_and_reasons(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="llmcap.trace.clean"):
        clean_trace(_raw([0.0, 1.0, 2.0], [10, NAN, 10], [5, 5, 0]), CleanParams())
        clean_trace(_raw([0.0], [10], [5]), CleanParams())
    assert [r.getMessage() for r in caplog.records if r.name == "llmcap.trace.clean"] == [
        "hand.csv: 3 rows in, 1 kept, 2 quarantined (isl_missing 1, osl_below_1 1)",
        "hand.csv: 1 rows in, 1 kept, 0 quarantined",
    ]


def test_nothing_kept_names_the_three_most_frequent_reasons_most_first() -> None:
    # osl_missing 3, osl_below_1 2, invalid_arrival 1, isl_zero 1: the ties keep REASONS order, the fourth is left out
    raw = _raw([NAN, 1, 2, 3, 4, 5, 6], [10, 0, 10, 10, 10, 10, 10], [5, 5, NAN, NAN, NAN, -1, -2])
    with pytest.raises(
        LlmcapError,
        match=re.escape("hand.csv: all 7 rows were quarantined (osl_missing=3, osl_below_1=2, invalid_arrival=1)"),
    ):
        clean_trace(raw, CleanParams()).require_rows()


# ---- duplicates -------------------------------------------------------------------------------------------


def test_duplicates_compare_every_label_and_the_hash_lists() -> None:
    labels = {
        "request_id": pa.array(["a", "a", "a", "a", "b"]),
        "tenant": pa.array(["x", "x", "y", "x", "x"]),
        "hash_ids": pa.array([[1, 2], [1, 2], [1, 2], [1, 3], [1, 2]], pa.list_(pa.int64())),
    }
    raw = _raw([0.0] * 5, [10] * 5, [5] * 5, labels=labels)
    # row 1 repeats row 0 exactly; 2 differs in tenant, 3 in its hash list, 4 in its id
    assert _reasons(clean_trace(raw, CleanParams())) == {1: ("duplicate", "exact duplicate of an earlier row")}


@pytest.mark.parametrize(("column", "values"), [("arrival", [0.0, 0.5]), ("isl", [10, 11]), ("osl", [5, 6])])
def test_rows_differing_in_one_length_or_arrival_are_not_duplicates(column: str, values: list) -> None:
    cols = {"arrival": [0.0, 0.0], "isl": [10, 10], "osl": [5, 5]}
    cols[column] = values
    result = clean_trace(_raw(cols["arrival"], cols["isl"], cols["osl"]), CleanParams(duplicates="identical"))
    assert result.report.rows_kept == 2
    # the same two rows with equal fields: one is a duplicate
    same = clean_trace(_raw([0.0, 0.0], [10, 10], [5, 5]), CleanParams(duplicates="identical"))
    assert same.report.by_reason == {"duplicate": 1}


# ---- exclude rules ----------------------------------------------------------------------------------------


def test_an_unusable_exclude_pattern_is_named() -> None:
    raw = _raw([0.0], [10], [5], labels={"tenant": pa.array(["a"])})
    # Python's re accepts a look-ahead (so the params do), Arrow's RE2 does not: its first line is quoted
    params = CleanParams(exclude=[ExcludeRule(field="tenant", pattern="(?=a)a")])
    with pytest.raises(LlmcapError) as info:
        clean_trace(raw, params)
    assert (
        str(info.value)
        == "exclude rule tenant='(?=a)a': not a usable regular expression (Invalid regular expression: invalid perl operator: (?=)"
    )


def test_an_exclude_rule_on_a_field_the_trace_lacks_excludes_nothing() -> None:
    result = clean_trace(_raw([0.0], [10], [5]), CleanParams(exclude=[ExcludeRule(field="tenant", pattern=".*")]))
    assert result.report.rows_kept == 1


# ---- warnings ---------------------------------------------------------------------------------------------


def _clock(gaps: list[float]) -> RawTrace:
    arrival = np.concatenate([[0.0], np.cumsum(gaps)])
    return _raw(arrival, [10] * arrival.size, [5] * arrival.size)


def test_reused_ids_are_warned_of_from_two_kept_rows_and_name_three_lines() -> None:
    two = _raw([0.0, 1.0], [10, 11], [5, 5], labels={"request_id": pa.array(["x", "x"])})
    assert clean_trace(two, CleanParams()).report.warnings == (
        "1 kept rows reuse an earlier row's request_id with different fields (e.g. 'x' at lines 2, 3); each is kept as its own request",
    )
    five = _raw([0.0, 1, 2, 3, 4], [10, 11, 12, 13, 14], [5] * 5, labels={"request_id": pa.array(["x"] * 5)})
    (warning,) = clean_trace(five, CleanParams()).report.warnings
    assert warning.startswith(
        "4 kept rows reuse an earlier row's request_id with different fields (e.g. 'x' at lines 2, 3, 4);"
    )


def test_a_clock_jump_within_the_first_5_percent_of_gaps_is_not_judged() -> None:
    # 220 positive gaps: each side of a split needs max(10, 220 // 20) = 11 of them. Gaps of 1 s then 10^2.6 s:
    # the jump after 11 gaps is seen whole (0 decades before, 2.6 after: 2.6 >= 2.5); after 10 gaps the first
    # allowed split (11) sees 2.6 / 11 = 0.24 decades before: 2.36 < 2.5, and later splits see less
    big = 10**2.6
    assert len(clean_trace(_clock([1.0] * 11 + [big] * 209), CleanParams()).report.warnings) == 1
    assert clean_trace(_clock([1.0] * 10 + [big] * 210), CleanParams()).report.warnings == ()
    # the same at the end: the last 11 gaps are enough, the last 10 are not
    assert len(clean_trace(_clock([1.0] * 209 + [big] * 11), CleanParams()).report.warnings) == 1
    assert clean_trace(_clock([1.0] * 210 + [big] * 10), CleanParams()).report.warnings == ()


def test_a_clock_jump_is_measured_between_the_two_means_and_named() -> None:
    # 20 gaps of 0.01 s (-2 decades) then 20 of 10^0.6 = 3.98 s (+0.6): 2.6 decades apart, a 398x change
    (warning,) = clean_trace(_clock([0.01] * 20 + [10**0.6] * 20), CleanParams()).report.warnings
    assert warning.startswith("typical gap between arrivals changes 398x at line 23 (0.01 s before, 3.98 s after)")
    # the first positive gap after the split is row 21's (gap 20, 0-based), row 21 + 1 = line 23


def test_repeated_arrivals_are_not_gaps() -> None:
    # 30 gaps of 1 s then 30 of 1000 s, with a repeated arrival (a 0 s gap) on each side: only positive gaps count
    gaps = [1.0] * 15 + [0.0] + [1.0] * 15 + [1000.0] * 15 + [0.0] + [1000.0] * 15
    (warning,) = clean_trace(_clock(gaps), CleanParams()).report.warnings
    assert warning.startswith("typical gap between arrivals changes 1,000x at line 34 (1 s before, 1e+03 s after)")


def test_a_clock_jump_of_exactly_2_5_decades_is_warned_of() -> None:
    # gaps alternate 1 and 100 s (logs 0, 2: mean 1), then 1000 and 10000 s (logs 3, 4: mean 3.5): every value exact,
    # the split after 20 gaps is 3.5 − 1 = 2.5 decades apart, the limit itself (other splits are less: after 19,
    # 18 / 19 against 72 / 21, 2.48)
    (warning,) = clean_trace(_clock([1.0, 100.0] * 10 + [1000.0, 10000.0] * 10), CleanParams()).report.warnings
    assert warning.startswith("typical gap between arrivals changes 316x at line 23 (10 s before, 3.16e+03 s after)")
