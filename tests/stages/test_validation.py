"""Great Expectations suites on stage outputs: good data passes, bad data fails with a readable summary,
and the saved record is a pure function of the data."""

from __future__ import annotations

import pytest

from llmcap.config import CleanParams
from llmcap.trace import REASONS, ingest
from stages import validation
from tests.conftest import TRACES


@pytest.fixture(scope="module")
def trace_frame():
    return ingest(TRACES["mooncake_synthetic"], clean=CleanParams()).trace.drop_columns(["hash_ids"]).to_pandas()


def _trace_suite(gxe):
    return validation.canonical_trace_suite(gxe, 262_144)


def test_clean_trace_passes(trace_frame) -> None:
    record = validation.validate(trace_frame, "canonical_trace", _trace_suite)
    assert record.success and record.failures() == []
    validation.require(record)  # does not raise


def test_broken_trace_fails_with_readable_summary(trace_frame) -> None:
    bad = trace_frame.copy()
    bad.loc[3, "isl"] = 0  # invalid length
    bad.loc[10, "arrival_s"] = -1.0  # negative and out of order
    bad.loc[20, "prefix_hit_tokens"] = bad.loc[20, "isl"] + 1  # more cached than the prompt
    record = validation.validate(bad, "canonical_trace", _trace_suite)
    assert not record.success
    failed = {r["expectation"] for r in record.failures()}
    assert failed == {
        "expect_column_values_to_be_between",
        "expect_column_values_to_be_increasing",
        "expect_column_pair_values_a_to_be_greater_than_b",
    }
    with pytest.raises(validation.ValidationFailed) as info:
        validation.require(record)
    text = str(info.value)
    assert text.startswith("suite 'canonical_trace': 4 of 13 expectations failed")
    assert "column=isl" in text and "column=arrival_s" in text


def test_quarantine_reasons_must_be_known(tmp_path) -> None:
    import pandas as pd

    frame = pd.DataFrame({"source_row": [1, 2], "reason": ["duplicate", "gremlins"]})
    record = validation.validate(frame, "quarantine", lambda gxe: validation.quarantine_suite(gxe, REASONS))
    assert [r["expectation"] for r in record.failures()] == ["expect_column_values_to_be_in_set"]
    assert record.failures()[0]["examples"] == ["gremlins"]


def test_record_is_deterministic(trace_frame, tmp_path) -> None:
    a = validation.validate(trace_frame, "canonical_trace", _trace_suite).write(tmp_path / "a.json")
    b = validation.validate(trace_frame, "canonical_trace", _trace_suite).write(tmp_path / "b.json")
    assert a.read_bytes() == b.read_bytes()
