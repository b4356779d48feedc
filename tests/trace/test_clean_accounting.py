"""Cleaning's accounting on one small hand-made file (llmcap.trace.clean), every number and reason written
out: each row's first failing check in `REASONS` order, its detail and line; kept rows sorted by arrival
(stably), re-based to 0 and numbered; the report's counts, duration, start and out-of-order count."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmcap.trace import ingest
from llmcap.trace.params import CleanParams, ExcludeRule, TraceParams

#   line: arrival, isl, osl, tenant, request_id           what happens (first failing check wins)
ROWS = [
    "10,100,10,a,r1",  # 2: kept (arrives first: 0 after re-basing)
    "12,abc,10,a,r2",  # 3: isl_missing
    "11,-5,10,a,r3",  # 4: isl_negative
    "13,0,10,a,r4",  # 5: isl_zero
    "14,1.5,10,a,r5",  # 6: isl_not_integer
    "15,100,,a,r6",  # 7: osl_missing
    "16,100,2.5,a,r7",  # 8: osl_not_integer
    "17,100,0,a,r8",  # 9: osl_below_1 (osl=0)
    "x,100,10,a,r9",  # 10: invalid_arrival (before any length check)
    "9,100,10,test,r10",  # 11: test_traffic (tenant matches the exclude rule)
    "18,5000,10,a,r11",  # 12: exceeds_max_context (5010 > 4096)
    "19,200,20,b,r12",  # 13: kept
    "10.5,300,30,b,r13",  # 14: kept, out of order (earlier than line 13's 19)
    "19,200,20,b,r12",  # 15: duplicate of line 13 (request id included)
    "19,400,40,b,r14",  # 16: kept, ties line 13's arrival: stays after it
]


@pytest.fixture  # per test (not per module): mutation testing runs only the tests that call the code
def cleaned(tmp_path: Path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,isl,osl,tenant,request_id\n" + "\n".join(ROWS) + "\n")
    params = CleanParams(max_context_tokens=4096, exclude=[ExcludeRule(field="tenant", pattern="te.t")])
    return ingest(path, TraceParams(file=str(path)), params)


def test_each_row_gets_its_first_failing_reason_with_its_line_and_detail(cleaned) -> None:
    q = cleaned.quarantine.to_pydict()
    got = {line: (reason, detail) for line, reason, detail in zip(q["line"], q["reason"], q["detail"], strict=True)}
    assert got == {
        3: ("isl_missing", "isl missing or not a number"),
        4: ("isl_negative", "isl=-5"),
        5: ("isl_zero", "isl=0"),
        6: ("isl_not_integer", "isl=1.5"),
        7: ("osl_missing", "osl missing or not a number"),
        8: ("osl_not_integer", "osl=2.5"),
        9: ("osl_below_1", "osl=0"),
        10: ("invalid_arrival", "missing or unparseable arrival time"),
        11: ("test_traffic", "tenant matches 'te.t'"),
        12: ("exceeds_max_context", "ISL+OSL=5010 > 4096"),
        15: ("duplicate", "exact duplicate of an earlier row"),
    }
    assert q["source_row"] == [line - 2 for line in q["line"]] and q["raw"][0] == "12,abc,10,a,r2"


def test_the_report_adds_up(cleaned) -> None:
    r = cleaned.report
    assert (r.rows_in, r.rows_kept, r.rows_quarantined) == (15, 4, 11) and r.accounting_ok
    assert r.by_reason == {
        "invalid_arrival": 1,
        "isl_missing": 1,
        "isl_negative": 1,
        "isl_zero": 1,
        "isl_not_integer": 1,
        "osl_missing": 1,
        "osl_not_integer": 1,
        "osl_below_1": 1,
        "exceeds_max_context": 1,
        "test_traffic": 1,
        "duplicate": 1,
    }
    assert list(r.by_reason) == [
        k
        for k in (
            "invalid_arrival",
            "isl_missing",
            "isl_negative",
            "isl_zero",
            "isl_not_integer",
            "osl_missing",
            "osl_not_integer",
            "osl_below_1",
            "exceeds_max_context",
            "test_traffic",
            "duplicate",
        )
    ]
    assert r.out_of_order_rows == 1  # line 14 (10.5) after line 13 (19)
    assert r.duration_s == pytest.approx(9.0)  # kept arrivals 10 .. 19
    assert r.start == "+10.000s" and r.arrival_column == "arrival_s" and r.warnings == ()


def test_kept_rows_are_sorted_stably_rebased_and_numbered(cleaned) -> None:
    t = cleaned.trace.to_pydict()
    assert t["source_row"] == [0, 12, 11, 14]  # by arrival; the tie at 19 keeps file order (line 13 before 16)
    assert t["arrival_s"] == pytest.approx([0.0, 0.5, 9.0, 9.0])
    assert t["request_id"] == [0, 1, 2, 3] and t["isl"] == [100, 300, 200, 400] and t["osl"] == [10, 30, 20, 40]
    assert t["tenant"] == ["a", "b", "b", "b"]


@pytest.mark.parametrize(
    ("params", "kept", "reasons"),
    [
        # [0.5, 9): 0 is before it, the three at 9 at its end (outside_window is checked before duplicate)
        (CleanParams(window_start_s=0.5, window_end_s=9.0), 1, {"outside_window": 4}),
        (CleanParams(window_start_s=0.5), 3, {"outside_window": 1, "duplicate": 1}),
        (CleanParams(duplicates="keep"), 5, {}),
        (CleanParams(duplicates="identical"), 4, {"duplicate": 1}),
    ],
)
def test_windows_and_duplicate_policies(tmp_path: Path, params: CleanParams, kept: int, reasons: dict) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,isl,osl,request_id\n0,100,10,a\n0.5,300,30,b\n9,200,20,c\n9,200,20,c\n9,400,40,d\n")
    r = ingest(path, TraceParams(file=str(path)), params).report
    assert (r.rows_kept, r.rows_quarantined, r.by_reason) == (kept, 5 - kept, reasons)


def _clean(tmp_path: Path, text: str, name: str = "t.csv", params: CleanParams | None = None, **trace):
    path = tmp_path / name
    path.write_text(text)
    return ingest(path, TraceParams(file=str(path), **trace), params or CleanParams())


def _gaps(before: float, after: float, n: int = 30) -> str:
    """A clock with n gaps of `before` s, then n gaps of `after` s."""
    t, rows = 0.0, ["0,100,10"]
    for k in range(2 * n):
        t += before if k < n else after
        rows.append(f"{t:g},100,10")
    return "arrival_s,isl,osl\n" + "\n".join(rows) + "\n"


@pytest.mark.parametrize(("after", "warns"), [(320.0, True), (310.0, False), (1 / 320, True), (1 / 310, False)])
def test_a_clock_whose_typical_gap_changes_by_more_than_10_to_the_2_5_is_warned_of(
    tmp_path: Path, after: float, warns: bool
) -> None:
    # 10^2.5 = 316.2: gaps of 1 s then 320 s (or 1/320 s) change by more; 310 does not
    r = _clean(tmp_path, _gaps(1.0, after)).report
    assert len(r.warnings) == int(warns)
    if warns:
        ratio = max(after, 1 / after)
        assert r.warnings[0].startswith(
            f"typical gap between arrivals changes {ratio:,.0f}x at line 33 (1 s before, {after:.3g} s after)"
        )


def test_too_few_gaps_are_not_judged(tmp_path: Path) -> None:
    # 9 gaps on each side: fewer than MIN_GAPS_EACH_SIDE (10), whatever they say
    assert _clean(tmp_path, _gaps(1.0, 1000.0, n=9)).report.warnings == ()
    assert len(_clean(tmp_path, _gaps(1.0, 1000.0, n=10)).report.warnings) == 1


def test_reused_ids_are_counted_and_named(tmp_path: Path) -> None:
    text = "request_id,arrival_s,isl,osl\nx,0,10,5\ny,1,10,5\nx,2,11,5\nx,3,12,5\ny,4,13,5\nz,5,10,5\n"
    (warning,) = _clean(tmp_path, text).report.warnings
    assert warning == (
        "3 kept rows reuse an earlier row's request_id with different fields (e.g. 'x' at lines 2, 4, 5); "
        "each is kept as its own request"
    )
    assert _clean(tmp_path, "request_id,arrival_s,isl,osl\nx,0,10,5\ny,1,10,5\n").report.warnings == ()


def test_a_datetime_clock_starts_at_the_first_kept_request(tmp_path: Path) -> None:
    text = "arrival_time,isl,osl\n2024-05-01T10:00:00,abc,5\n2024-05-01T10:00:02.5,10,5\n2024-05-01T10:00:04,10,5\n"
    r = _clean(tmp_path, text).report
    assert (
        r.start == "2024-05-01T10:00:02.500000000"
        and r.duration_s == pytest.approx(1.5)
        and r.arrival_unit == "datetime"
    )


def test_a_relative_clock_starts_at_its_offset(tmp_path: Path) -> None:
    r = _clean(tmp_path, "arrival_s,isl,osl\n5,abc,5\n7.25,10,5\n9,10,5\n").report
    assert r.start == "+7.250s" and r.duration_s == pytest.approx(
        1.75
    )  # on the file's own clock: the first kept request's time


def test_nothing_kept_is_an_error_naming_the_top_reasons(tmp_path: Path) -> None:
    from llmcap.errors import LlmcapError

    result = _clean(tmp_path, "arrival_s,isl,osl\n0,abc,5\n1,-1,5\n2,xyz,5\n3,0,5\n")
    assert result.report.rows_kept == 0 and result.quarantine.num_rows == 4
    with pytest.raises(
        LlmcapError, match=re.escape("t.csv: all 4 rows were quarantined (isl_missing=2, isl_negative=1, isl_zero=1)")
    ):
        result.require_rows()


def test_prefix_hashes_give_each_request_its_reused_tokens(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 1000, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 2000, "input_length": 600, "output_length": 5, "hash_ids": [1, 9]},
        {"timestamp": 3000, "input_length": 10, "output_length": 5, "hash_ids": "not a list"},
    ]
    import json

    result = _clean(tmp_path, "".join(json.dumps(r) + "\n" for r in lines), name="m.jsonl")
    t = result.trace.to_pydict()
    # block 512: request 2 reuses blocks 1, 2 (1024 tokens); request 3 reuses block 1 (512 of its 600)
    assert t["prefix_hit_tokens"] == [0, 1024, 512] and t["hash_ids"] == [[1, 2], [1, 2, 3], [1, 9]]
    assert result.report.by_reason == {"hash_ids_invalid": 1} and result.report.block_size == 512
