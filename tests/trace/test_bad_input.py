"""Bad input: unusable files fail with one clear line (file, line, field), exit code 2, no traceback;
usable files quarantine the bad rows with reasons and exact accounting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from llmcap.config import CleanParams, TraceParams
from llmcap.errors import InputFileError
from llmcap.trace import ingest, read_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmcap", *args], capture_output=True, text=True, timeout=120)


def assert_one_clear_error(proc: subprocess.CompletedProcess, path: Path, *fragments: str) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith(f"error: {path}")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


# ---------------------------------------------------------------- unusable files: one clear error


def test_empty_file(tmp_path: Path) -> None:
    path = write(tmp_path, "empty.csv", "")
    assert_one_clear_error(run_cli("trace", "inspect", str(path)), path, f"{path}:1:", "empty")


def test_header_only(tmp_path: Path) -> None:
    path = write(tmp_path, "header.csv", AZURE_HEADER)
    assert_one_clear_error(run_cli("trace", "inspect", str(path)), path, f"{path}:2:", "no data rows")


def test_wrong_delimiter(tmp_path: Path) -> None:
    path = write(tmp_path, "semi.csv", "TIMESTAMP;ContextTokens;GeneratedTokens\n2023-11-16 18:15:46.68;374;44\n")
    assert_one_clear_error(run_cli("trace", "inspect", str(path)), path, f"{path}:1:", "semicolon")


def test_binary_garbage(tmp_path: Path) -> None:
    garbage = np.random.default_rng(7).integers(0, 256, size=4096, dtype=np.uint8).tobytes()
    path = write(tmp_path, "garbage.bin", garbage)
    assert_one_clear_error(run_cli("trace", "inspect", str(path)), path, "binary" if b"\x00" in garbage else "UTF-8")


def test_missing_required_column(tmp_path: Path) -> None:
    path = write(tmp_path, "nogen.csv", "TIMESTAMP,ContextTokens\r\n2023-11-16 18:15:46.6805900,374\r\n")
    assert_one_clear_error(run_cli("trace", "inspect", str(path)), path, f"{path}:1:", "field 'GeneratedTokens'")


def test_missing_required_field_in_jsonl(tmp_path: Path) -> None:
    path = write(tmp_path, "noosl.jsonl", '{"timestamp": 0, "input_length": 10, "hash_ids": [1]}\n')
    assert_one_clear_error(
        run_cli("trace", "inspect", "--format", "mooncake", str(path)), path, "field 'output_length'"
    )


def test_seconds_vs_milliseconds_ambiguity(tmp_path: Path) -> None:
    # 1,000 integer timestamps over 3,600 units: 0.28 req/s if seconds, 278 req/s if milliseconds.
    stamps = np.sort(np.random.default_rng(0).integers(0, 3_600, size=1_000))
    body = "timestamp,isl,osl\n" + "".join(f"{t},100,10\n" for t in stamps)
    path = write(tmp_path, "ambiguous.csv", body)
    line = assert_one_clear_error(
        run_cli("trace", "inspect", "-c", "arrival=timestamp", str(path)), path, "field 'timestamp'"
    )
    assert "seconds or milliseconds" in line and "time_unit" in line
    # Saying the unit resolves it.
    for unit, duration in (("s", 3_600), ("ms", 3.6)):
        raw = read_trace(path, TraceParams(file=str(path), columns={"arrival": "timestamp"}, time_unit=unit))
        assert np.nanmax(raw.arrival_s) == pytest.approx((stamps[-1] - stamps[0]) * duration / 3_600)


def test_epoch_milliseconds_are_not_ambiguous(tmp_path: Path) -> None:
    body = "ts,isl,osl\n1700000000000,10,5\n1700000001500,12,6\n"
    path = write(tmp_path, "epoch.csv", body)
    raw = read_trace(path, TraceParams(file=str(path), columns={"arrival": "ts"}))
    assert raw.arrival_s.tolist() == [0.0, 1.5]
    assert raw.start == "2023-11-14T22:13:20.000000000"


def test_unknown_generic_columns_name_what_is_missing(tmp_path: Path) -> None:
    path = write(tmp_path, "other.csv", "a,b\n1,2\n")
    assert_one_clear_error(run_cli("trace", "inspect", str(path)), path, f"{path}:1:", "field 'isl'")


def test_all_rows_invalid_is_an_error_after_quarantine_is_written(tmp_path: Path) -> None:
    path = write(tmp_path, "allbad.csv", AZURE_HEADER + "2023-11-16 18:15:46.68,0,5\r\n2023-11-16 18:15:47.68,-3,5")
    out = tmp_path / "clean.parquet"
    proc = run_cli("trace", "clean", str(path), "-o", str(out))
    assert proc.returncode == 2 and "all 2 rows were quarantined" in proc.stderr
    assert pq.read_table(tmp_path / "clean.quarantine.parquet").column("reason").to_pylist() == [
        "isl_zero",
        "isl_negative",
    ]


def test_api_raises_input_file_error_with_location(tmp_path: Path) -> None:
    path = write(tmp_path, "nogen.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,374\n")
    with pytest.raises(InputFileError) as info:
        read_trace(path)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 1, "GeneratedTokens")


# ---------------------------------------------------------------- usable files: quarantine + accounting


def _reasons(result) -> dict[int, str]:
    q = result.quarantine
    return dict(zip(q.column("line").to_pylist(), q.column("reason").to_pylist(), strict=True))


def test_nan_negative_zero_and_fractional_lengths(tmp_path: Path) -> None:
    rows = [
        "2023-11-16 18:00:00.0000000,100,10",  # ok (line 2)
        "2023-11-16 18:00:01.0000000,NaN,10",  # 3
        "2023-11-16 18:00:02.0000000,-5,10",  # 4
        "2023-11-16 18:00:03.0000000,0,10",  # 5
        "2023-11-16 18:00:04.0000000,100,0",  # 6
        "2023-11-16 18:00:05.0000000,100,-1",  # 7
        "2023-11-16 18:00:06.0000000,12.5,10",  # 8
        "2023-11-16 18:00:07.0000000,abc,10",  # 9
        "2023-11-16 18:00:08.0000000,100,",  # 10
        "not a time,100,10",  # 11
        "2023-11-16 18:00:09.0000000,inf,10",  # 12
        "2023-11-16 18:00:10.0000000,200,20",  # ok (13)
    ]
    path = write(tmp_path, "lengths.csv", AZURE_HEADER + "\r\n".join(rows))
    result = ingest(path)
    assert _reasons(result) == {
        3: "isl_missing",
        4: "isl_negative",
        5: "isl_zero",
        6: "osl_below_1",
        7: "osl_below_1",
        8: "isl_not_integer",
        9: "isl_missing",
        10: "osl_missing",
        11: "invalid_arrival",
        12: "isl_not_finite",
    }
    r = result.report
    assert (r.rows_in, r.rows_kept, r.rows_quarantined, r.accounting_ok) == (12, 2, 10, True)
    assert result.trace.column("isl").to_pylist() == [100, 200]
    assert result.trace.column("arrival_s").to_pylist() == [0.0, 10.0]
    raw_text = dict(
        zip(result.quarantine.column("line").to_pylist(), result.quarantine.column("raw").to_pylist(), strict=True)
    )
    assert raw_text[4] == "2023-11-16 18:00:02.0000000,-5,10"


def test_unsorted_and_duplicated_timestamps(tmp_path: Path) -> None:
    lines = [
        '{"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}',
        '{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}',
        '{"timestamp": 3000, "input_length": 700, "output_length": 7, "hash_ids": [1, 3]}',
        '{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}',
        '{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [9]}',
    ]
    path = write(tmp_path, "unsorted.jsonl", "\n".join(lines) + "\n")
    # Without a request id, equal rows are distinct requests on a coarse clock: nothing is dropped by default.
    assert ingest(path).report.rows_kept == 5
    result = ingest(path, clean=CleanParams(duplicates="identical"))
    # strict: line 4 repeats line 2 exactly; line 5 differs only in its hashes, so it is kept
    assert _reasons(result) == {4: "duplicate"}
    t = result.trace
    assert t.column("source_row").to_pylist() == [1, 4, 0, 2]  # sorted by arrival, ties in file order
    assert t.column("arrival_s").to_pylist() == [0.0, 0.0, 3.0, 3.0]
    assert t.column("request_id").to_pylist() == [0, 1, 2, 3]
    assert result.report.out_of_order_rows == 2
    # prefix reuse is computed in arrival order: block 1 seen first by source row 1
    assert t.column("prefix_hit_tokens").to_pylist() == [0, 0, 512, 512]


def test_truncated_last_line_jsonl(tmp_path: Path) -> None:
    good = "".join(
        f'{{"timestamp": {t}, "input_length": 100, "output_length": 5, "hash_ids": [1]}}\n' for t in (0, 5, 9)
    )
    path = write(tmp_path, "trunc.jsonl", good + '{"timestamp": 9, "input_length": 1')
    result = ingest(path)
    assert _reasons(result) == {4: "malformed_record"}
    assert result.quarantine.column("raw").to_pylist() == ['{"timestamp": 9, "input_length": 1']
    assert (result.report.rows_in, result.report.rows_kept, result.report.rows_quarantined) == (4, 3, 1)
    assert result.trace.column("arrival_s").to_pylist() == [0.0, 0.005, 0.009]


def test_truncated_last_line_csv(tmp_path: Path) -> None:
    path = write(tmp_path, "trunc.csv", AZURE_HEADER + "2023-11-16 18:15:46.6805900,374,44\r\n2023-11-16 18:15:50.99")
    result = ingest(path)
    assert _reasons(result) == {3: "malformed_record"}
    assert result.quarantine.column("detail").to_pylist() == ["malformed record: expected 3 columns, got 1"]
    assert result.report.rows_kept == 1


def test_utf8_bom(tmp_path: Path) -> None:
    path = write(
        tmp_path, "bom.csv", b"\xef\xbb\xbf" + (AZURE_HEADER + "2023-11-16 18:15:46.6805900,374,44\r\n").encode()
    )
    result = ingest(path)
    assert result.report.source_format == "azure"
    assert result.trace.column("isl").to_pylist() == [374]
    jpath = write(
        tmp_path,
        "bom.jsonl",
        b"\xef\xbb\xbf" + b'{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [4]}\n',
    )
    assert ingest(jpath).trace.column("osl").to_pylist() == [2]


def test_absurd_lengths(tmp_path: Path) -> None:
    path = write(tmp_path, "huge.csv", AZURE_HEADER + "2023-11-16 18:15:46.68,1e9,10\r\n2023-11-16 18:15:47.68,100,10")
    result = ingest(path, clean=CleanParams(max_context_tokens=131_072))
    assert _reasons(result) == {2: "exceeds_max_context"}
    assert result.quarantine.column("detail").to_pylist() == ["ISL+OSL=1e+09 > 131072"]


def test_wrong_types_inside_jsonl_are_quarantined_not_fatal(tmp_path: Path) -> None:
    lines = [
        '{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}',
        '{"timestamp": 1, "input_length": "lots", "output_length": 5, "hash_ids": [2]}',
        "[1, 2, 3]",
        '{"timestamp": 2, "input_length": 100, "output_length": 6, "hash_ids": "x"}',
    ]
    path = write(tmp_path, "types.jsonl", "\n".join(lines) + "\n")
    result = ingest(path)
    assert _reasons(result) == {2: "isl_missing", 3: "malformed_record", 4: "hash_ids_invalid"}
    assert result.report.accounting_ok and result.report.rows_kept == 1


def test_burstgpt_failed_requests(tmp_path: Path) -> None:
    body = (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,API log\n"
    )
    path = write(tmp_path, "burst.csv", body)
    result = ingest(path)
    assert result.report.source_format == "burstgpt"
    assert _reasons(result) == {3: "failed_request"}
    assert result.trace.column("model").to_pylist() == ["ChatGPT", "GPT-4"]
    assert result.trace.column("tenant").to_pylist() == ["Conversation log", "API log"]
    assert result.trace.column("arrival_s").to_pylist() == [0.0, 113.0]


def test_window_and_test_traffic_rules(tmp_path: Path) -> None:
    body = "arrival_s,isl,osl,tenant\n0,10,5,prod\n10,10,5,loadtest-3\n20,10,5,prod\n30,10,5,prod\n"
    path = write(tmp_path, "generic.csv", body)
    params = CleanParams(window_start_s=5, window_end_s=30, exclude=[{"field": "tenant", "pattern": "loadtest-.*"}])
    result = ingest(path, clean=params)
    assert _reasons(result) == {2: "outside_window", 3: "test_traffic", 5: "outside_window"}
    assert result.trace.column("arrival_s").to_pylist() == [0.0]
    assert result.report.start == "+20.000s"
