"""Hostile but realistic inputs through every command that reads a trace (`trace inspect`, `trace clean`,
`simulate`, `size`): each ends in exit 0 with exact accounting (rows in = kept + quarantined, the
counts this file wrote), or in exit 2 with one line naming the file (and line/field where there is
one) — never a traceback. Runs in process (typer's CliRunner); one case goes through a real shell pipe.
"""

from __future__ import annotations

import bz2
import gzip
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.commands.size import MIN_REQUESTS

runner = CliRunner()
COMMANDS = ("inspect", "clean", "simulate", "size")
MODEL = ["-m", "Llama-3.1-8B"]
SIZE_SMALL = [
    *MODEL,
    "--slo-ttft-p99",
    "2000",
    "--slo-itl-p99",
    "100",
    "--gpu",
    "h100",
    "--tp",
    "1",
    "--weight-quant",
    "fp8",
    "--no-pd",
    "--shortlist",
    "1",
    "--excerpt",
    "50",
]
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
U64 = 18_446_744_073_709_551_615  # 2^64 - 1: real hash ids use the whole unsigned range


def csv(header: str, rows: list[str]) -> bytes:
    return (header + "\n" + "\n".join(rows) + "\n").encode()


def mooncake(rows: list[tuple[int, int, int, list[int]]]) -> bytes:
    return "".join(
        json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h}) + "\n" for t, i, o, h in rows
    ).encode()


def parquet_bytes(table: pa.Table, tmp: Path) -> bytes:
    path = tmp / "_build.parquet"
    pq.write_table(table, path)
    return path.read_bytes()


@dataclass(frozen=True)
class Case:
    name: str
    content: Callable[[Path], bytes] | bytes
    filename: str
    # "ok": (rows_in, kept, quarantined); "error": fragments the one error line must hold
    ok: tuple[int, int, int] | None = None
    error: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    line: int | None = None  # the error names this line of the file
    field_name: str | None = None  # ... and this field
    check: Callable[[dict], None] | None = None  # extra checks on the inspect JSON
    by_reason: dict[str, int] = field(default_factory=dict)
    warns: tuple[str, ...] = ()  # fragments of the one warning a kept-but-suspicious input must get (JSON and stderr)


def _dst(s: dict) -> None:
    # 01:59 at -05:00 and 03:00:30 at -04:00 are 90 s apart in UTC (the wall clock jumped an hour)
    assert s["duration_s"] == pytest.approx(90.0)


def _rate(expected: float | None) -> Callable[[dict], None]:
    def check(s: dict) -> None:
        assert s["mean_rps"] == (None if expected is None else pytest.approx(expected, rel=1e-9))

    return check


def _templates(n: int = 600, seconds: int = 59) -> bytes:
    """Distinct requests on a whole-second clock, built from three length templates: many rows are equal."""
    rng = np.random.default_rng(0)
    stamps = np.sort(rng.integers(0, seconds + 1, n))
    stamps[0], stamps[-1] = 0, seconds
    templates = [(100, 20), (500, 50), (2000, 200)]
    picks = rng.integers(0, 3, n)
    return csv(
        "arrival_s,isl,osl", [f"{t},{templates[k][0]},{templates[k][1]}" for t, k in zip(stamps, picks, strict=True)]
    )


def _burstgpt(n: int = 3_000) -> bytes:
    rng = np.random.default_rng(1)
    stamps = np.sort(rng.integers(0, 600, n))
    rows = [
        f"{t},ChatGPT,{[472, 1087, 417][k]},{[18, 90, 276][k]},0,Conversation log"
        for t, k in zip(stamps, rng.integers(0, 3, n), strict=True)
    ]
    return csv("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", rows)


def _uint64_parquet(tmp: Path) -> bytes:
    hashes = pa.array([[U64, 1], [U64, 2], [3]], pa.list_(pa.uint64()))
    table = pa.table({"arrival_s": [0.0, 1.0, 2.5], "isl": [20, 20, 10], "osl": [4, 5, 6], "hash_ids": hashes})
    return parquet_bytes(table, tmp)


def _unhashed_parquet_without_block_size(tmp: Path) -> bytes:
    table = pa.table(
        {
            "arrival_s": [0.0, 1.0],
            "isl": [20, 20],
            "osl": [4, 5],
            "hash_ids": pa.array([[1], [1, 2]], pa.list_(pa.int64())),
        }
    )
    return parquet_bytes(table, tmp)


def _typed_parquet(**overrides: pa.Array) -> Callable[[Path], bytes]:
    """A three-row Parquet trace with the given columns replaced (a typed container can hold anything)."""

    def build(tmp: Path) -> bytes:
        columns = {"arrival_s": pa.array([0.0, 1.0, 2.0]), "isl": pa.array([10, 20, 30]), "osl": pa.array([4, 5, 6])}
        return parquet_bytes(pa.table(columns | overrides), tmp)

    return build


def _past_sniff(rows: int, bad_row: int, bad: bytes) -> bytes:
    """A CSV longer than the 64 KiB format sniff, with record `bad_row` (0-based; line bad_row + 2) replaced."""
    lines = [f"{k},10,5,t".encode() for k in range(rows)]
    lines[bad_row] = bad
    return b"arrival_s,isl,osl,tenant\n" + b"\n".join(lines) + b"\n"


#: Seconds for 30 rows, then the same clock in milliseconds: the rate read would be ~1000x too low.
UNIT_SWITCH = [f"{k * 0.5:g},100,10" for k in range(30)] + [f"{15_000 + k * 500},100,10" for k in range(30)]

PLAIN_ROWS = ["0,100,10", "1.5,120,12", "3,90,9", "4.5,300,30", "6,100,10"]

CASES: list[Case] = [
    # ---- plausible inputs that must work
    Case("header_spaces", b"arrival_s, isl, osl\n0, 10, 5\n1, 12, 6\n2, 14, 7\n", "spaces.csv", ok=(3, 3, 0)),
    Case(
        "dst_offsets",
        csv("arrival_time,isl,osl", ["2024-03-10T01:59:00-05:00,10,5", "2024-03-10T03:00:30-04:00,12,6"]),
        "dst.csv",
        ok=(2, 2, 0),
        check=_dst,
    ),
    Case(
        "uint64_hashes_jsonl",
        mooncake([(0, 600, 5, [U64, 12]), (10, 600, 5, [U64, 13]), (20, 100, 3, [U64])]),
        "u64.jsonl",
        ok=(3, 3, 0),
    ),
    Case("uint64_hashes_parquet", _uint64_parquet, "u64.parquet", ok=(3, 3, 0), args=("--hash-block-size", "16")),
    Case("gzip", gzip.compress(csv("arrival_s,isl,osl", PLAIN_ROWS)), "plain.csv.gz", ok=(5, 5, 0)),
    Case("bzip2", bz2.compress(mooncake([(0, 600, 5, [1, 2]), (500, 700, 7, [1, 3])])), "moon.jsonl.bz2", ok=(2, 2, 0)),
    Case(
        "clock_arrival_ms",
        csv("arrival_ms,isl,osl", [f"{k * 10_000},100,10" for k in range(5)]),
        "ms.csv",
        ok=(5, 5, 0),
        check=_rate(5 / 40),
    ),
    Case(
        "clock_iso_arrival_time",
        csv("arrival_time,isl,osl", [f"2024-05-01T10:00:{k * 10:02d},100,10" for k in range(5)]),
        "iso.csv",
        ok=(5, 5, 0),
        check=_rate(5 / 40),
    ),
    Case(
        "clock_epoch_timestamp",
        csv("timestamp,isl,osl", [f"{1_700_000_000 + k * 10},100,10" for k in range(5)]),
        "epoch.csv",
        ok=(5, 5, 0),
        check=_rate(5 / 40),
    ),
    Case("templates_whole_seconds", _templates(), "templates.csv", ok=(600, 600, 0), check=_rate(600 / 59)),
    Case("burstgpt_templates", _burstgpt(), "burst.csv", ok=(3_000, 3_000, 0)),
    Case(
        "request_id_duplicates",
        csv("request_id,arrival_s,isl,osl", ["a,0,10,5", "b,1,10,5", "a,0,10,5", "a,2,10,5"]),
        "ids.csv",
        ok=(4, 3, 1),
        by_reason={"duplicate": 1},
        warns=("'a' at lines 2, 5", "kept as its own request"),
    ),
    Case(
        "generated_arrivals_asked",
        csv("isl,osl", ["100,10", "200,20", "300,30"]),
        "lengths.csv",
        ok=(3, 3, 0),
        args=("--generate-arrivals",),
    ),
    Case(
        "constant_lengths",
        csv("arrival_s,isl,osl", ["0,100,10", "1,100,10", "2,100,10", "3,100,10"]),
        "const.csv",
        ok=(4, 4, 0),
    ),
    Case(
        "bad_rows_quarantined",
        (
            AZURE_HEADER + "2023-11-16 18:00:00.0,100,10\r\n2023-11-16 18:00:01.0,-5,10\r\n"
            "2023-11-16 18:00:02.0,abc,10\r\n2023-11-16 18:00:03.0,200,20\r\n"
        ).encode(),
        "azure.csv",
        ok=(4, 2, 2),
        by_reason={"isl_negative": 1, "isl_missing": 1},
    ),
    Case("utf8_bom", b"\xef\xbb\xbf" + csv("arrival_s,isl,osl", PLAIN_ROWS), "bom.csv", ok=(5, 5, 0)),
    # ---- unusable inputs: one line, exit 2
    Case(
        "no_clock_column",
        csv("isl,osl", ["100,10", "200,20"]),
        "lengths.csv",
        error=("no arrival-time column", "-c arrival=", "--generate-arrivals"),
        line=1,
        field_name="arrival_s",
    ),
    Case(
        "two_clock_columns",
        csv("timestamp,time,isl,osl", ["0,0,100,10", "5,5,200,20"]),
        "two.csv",
        error=("several columns could be the arrival clock", "timestamp, time"),
        line=1,
    ),
    Case(
        "ambiguous_integer_clock",
        csv("timestamp,isl,osl", [f"{k * 10},100,10" for k in range(5)]),
        "amb.csv",
        error=("seconds or milliseconds", "time_unit"),
        field_name="timestamp",
    ),
    Case(
        "epoch_ms_in_seconds_column",
        csv("arrival_s,isl,osl", ["1700000000000,10,5", "1700000001500,12,6"]),
        "ems.csv",
        error=("not seconds", "epoch milliseconds", "--time-unit ms"),
        field_name="arrival_s",
    ),
    Case(
        "mixed_naive_and_aware",
        csv(
            "arrival_time,isl,osl",
            ["2024-03-10T01:59:00-05:00,10,5", "2024-03-10T07:00:30,10,5", "2024-03-10T07:01:30-05:00,10,5"],
        ),
        "mixtz.csv",
        error=("UTC offset",),
        line=3,
        field_name="arrival_time",
    ),
    Case(
        "hashes_without_block_size",
        _unhashed_parquet_without_block_size,
        "hashes.parquet",
        error=("--hash-block-size",),
        field_name="hash_ids",
    ),
    Case("empty_file", b"", "empty.csv", error=("empty",), line=1),
    Case("header_only", AZURE_HEADER.encode(), "header.csv", error=("no data rows",), line=2),
    Case(
        "semicolons",
        b"TIMESTAMP;ContextTokens;GeneratedTokens\n2023-11-16 18:15:46.68;374;44\n",
        "semi.csv",
        error=("semicolon",),
        line=1,
    ),
    Case("binary", b"\x00\x01\x02garbage", "garbage.bin", error=("binary",)),
    Case("corrupt_gzip", b"\x1f\x8b\x08\x00not really gzip", "broken.csv.gz", error=("cannot read compressed input",)),
    Case(
        "missing_required",
        b"TIMESTAMP,ContextTokens\r\n2023-11-16 18:15:46.68,374\r\n",
        "nogen.csv",
        error=("GeneratedTokens",),
        line=1,
    ),
    Case(
        "quoted_newline",
        b'arrival_s,isl,osl,tenant\n0,10,5,"a\nb"\n1,10,5,x\n',
        "quoted.csv",
        error=("quoted newlines",),
        line=2,
    ),
    # ---- round 3: nested and odd types, duplicate names, units that change, ids reused, zero spans, encodings
    Case(
        "list_lengths_parquet",
        _typed_parquet(osl=pa.array([[1, 2], [3], [4]])),
        "list.parquet",
        error=("list<", "a number per request"),
        field_name="osl",
    ),
    Case(
        "struct_lengths_parquet",
        _typed_parquet(isl=pa.array([{"a": 1}, {"a": 2}, {"a": 3}])),
        "struct.parquet",
        error=("struct<", "a number per request"),
        field_name="isl",
    ),
    Case(
        "bool_lengths_parquet",
        _typed_parquet(isl=pa.array([True, False, True])),
        "bool.parquet",
        error=("bool values",),
        field_name="isl",
    ),
    Case(
        "list_label_parquet",
        _typed_parquet(tenant=pa.array([["a"], ["b"], ["c"]])),
        "label.parquet",
        error=("a text label",),
        field_name="tenant",
    ),
    Case(
        "nested_value_jsonl",
        b'{"arrival_s": 0, "isl": 10, "osl": 5}\n{"arrival_s": 1, "isl": 10, "osl": [1, 2]}\n'
        b'{"arrival_s": 2, "isl": 10, "osl": 6}\n',
        "nested.jsonl",
        ok=(3, 2, 1),
        by_reason={"osl_missing": 1},
    ),
    Case(
        "duplicate_column",
        csv("arrival_s,isl,isl,osl", ["0,10,20,5", "1,10,20,5"]),
        "dup.csv",
        error=("2 times (columns 2, 3)", "ambiguous"),
        line=1,
        field_name="isl",
    ),
    Case(
        "duplicate_unused_column",
        csv("arrival_s,isl,osl,note,note", ["0,10,5,a,b", "1,10,5,c,d"]),
        "dupnote.csv",
        ok=(2, 2, 0),
    ),
    Case(
        "clock_switches_units",
        csv("arrival_s,isl,osl", UNIT_SWITCH),
        "switch.csv",
        ok=(60, 60, 0),
        warns=("changes 1,", "at line 32", "switch units part-way"),
    ),
    Case(
        "request_id_reused",
        csv("request_id,arrival_s,isl,osl", ["a,0,10,5", "a,1,20,6", "b,2,10,5"]),
        "reused.csv",
        ok=(3, 3, 0),
        warns=("1 kept rows reuse an earlier row's request_id", "'a' at lines 2, 3"),
    ),
    Case("one_row", csv("arrival_s,isl,osl", ["0,10,5"]), "one.csv", ok=(1, 1, 0), check=_rate(None)),
    Case(
        "one_instant",
        csv("arrival_s,isl,osl", ["5,10,5", "5,11,5", "5,12,5"]),
        "instant.csv",
        ok=(3, 3, 0),
        check=_rate(None),
    ),
    Case("utf16", "arrival_s,isl,osl\n0,10,5\n".encode("utf-16"), "utf16.csv", error=("UTF-16", "iconv"), line=1),
    Case(
        "bad_byte_past_sniff",
        _past_sniff(8_000, 6_000, b"6000,1\xff0,5,t"),
        "latebyte.csv",
        ok=(8_000, 7_999, 1),
        by_reason={"malformed_record": 1},
    ),
    Case(
        "quoted_newline_past_sniff",
        _past_sniff(8_000, 6_000, b'6000,10,5,"a\nb"'),
        "latequote.csv",
        error=("quoted field runs onto the next line",),
        line=6_002,
    ),
]


def _command(cmd: str, path: Path, tmp: Path, args: tuple[str, ...]) -> list[str]:
    if cmd == "inspect":
        return ["trace", "inspect", str(path), *args, "--json"]
    if cmd == "clean":
        return ["trace", "clean", str(path), "-o", str(tmp / "out.parquet"), *args, "--json"]
    if cmd == "simulate":
        return ["simulate", "-t", str(path), *MODEL, "-g", "h100", *args, "--json"]
    return ["size", "-t", str(path), *SIZE_SMALL, *args, "--json"]


def _accounting(cmd: str, out: dict) -> dict:
    return {"inspect": out.get("accounting"), "clean": out}.get(cmd) or out["input_accounting"]


def _write(case: Case, tmp: Path) -> Path:
    path = tmp / case.filename
    path.write_bytes(case.content(tmp) if callable(case.content) else case.content)
    return path


@pytest.mark.parametrize("cmd", COMMANDS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_input_is_handled_or_named(case: Case, cmd: str, tmp_path: Path) -> None:
    path = _write(case, tmp_path)
    result = runner.invoke(app, _command(cmd, path, tmp_path, case.args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if case.ok is not None and cmd == "size" and case.ok[1] < MIN_REQUESTS:
        *warnings, last = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and last == (
            f"error: {path}: {case.ok[1]} usable requests are too few to size on (at least {MIN_REQUESTS}: rates are judged on a steady window)"
        ), result.output
        assert len(warnings) == len(case.warns[:1]) and all(w.startswith(f"warning: {path}: ") for w in warnings), (
            warnings
        )
        return
    if case.ok is not None:
        assert result.exit_code == 0, result.output
        acc = _accounting(cmd, json.loads(result.stdout))
        assert (acc["rows_in"], acc["rows_kept"], acc["rows_quarantined"]) == case.ok
        assert acc["rows_in"] == acc["rows_kept"] + acc["rows_quarantined"]
        assert acc["by_reason"] == case.by_reason
        assert len(acc["warnings"]) == (1 if case.warns else 0), acc["warnings"]
        for fragment in case.warns:
            assert fragment in acc["warnings"][0], (fragment, acc["warnings"][0])
            assert f"warning: {path}: " in result.stderr  # said where people look, not only in the JSON
        if cmd == "inspect" and case.check is not None:
            case.check(json.loads(result.stdout))
        return
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    where = f"error: {path}" + (f":{case.line}:" if case.line is not None else "")
    assert lines[0].startswith(where), (where, lines[0])
    for fragment in case.error + ((f"field '{case.field_name}'",) if case.field_name else ()):
        assert fragment in lines[0], (fragment, lines[0])


# ---------------------------------------------------------------- what is planned for is what the file holds


def _summary(args: list[str]) -> dict:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_equal_rows_on_a_coarse_clock_are_planned_as_the_file_holds(tmp_path: Path) -> None:
    path = tmp_path / "templates.csv"
    path.write_bytes(_templates())
    sim = _summary(["simulate", "-t", str(path), *MODEL, "-g", "h100", "--json"])
    assert sim["requests"] == 600 and sim["completed"] == 600
    size = _summary(["size", "-t", str(path), *SIZE_SMALL, "--json"])
    assert size["target_rps"] == pytest.approx(600 / 59)
    # strict deduplication is there when asked for, and says what it dropped
    strict = _summary(["simulate", "-t", str(path), *MODEL, "-g", "h100", "--duplicates", "identical", "--json"])
    acc = strict["input_accounting"]
    assert strict["requests"] == acc["rows_kept"] < 600 and acc["by_reason"]["duplicate"] == 600 - acc["rows_kept"]


def test_arrivals_are_generated_only_when_asked_and_said(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_bytes(csv("isl,osl", [f"{100 + k},10" for k in range(50)]))
    result = runner.invoke(app, ["simulate", "-t", str(path), *MODEL, "-g", "h100"])
    assert result.exit_code == 2 and "no arrival-time column" in result.stderr
    result = runner.invoke(
        app, ["simulate", "-t", str(path), *MODEL, "-g", "h100", "--generate-arrivals", "--arrival-rate", "4"]
    )
    assert result.exit_code == 0, result.output
    assert "arrivals GENERATED" in result.stderr
    acc = _summary(["trace", "inspect", str(path), "--generate-arrivals", "--json"])["accounting"]
    assert acc["generated_arrivals"] is True and acc["arrival_column"] is None
    # a length-only format (Vidur's) needs no asking, and is still announced
    vidur = tmp_path / "vidur.csv"
    vidur.write_bytes(csv("num_prefill_tokens,num_decode_tokens", ["100,10", "200,20", "300,30"]))
    acc = _summary(["trace", "inspect", str(vidur), "--json"])["accounting"]
    assert acc["generated_arrivals"] is True


def test_clean_then_size_and_simulate_read_the_parquet_with_its_metadata(tmp_path: Path) -> None:
    source = tmp_path / "moon.jsonl"
    source.write_bytes(mooncake([(k * 400, 600 + 10 * k, 5 + k % 7, [1, 2, 100 + k]) for k in range(60)]))
    clean = tmp_path / "clean.parquet"
    assert runner.invoke(app, ["trace", "clean", str(source), "-o", str(clean)]).exit_code == 0
    inspected = _summary(["trace", "inspect", str(clean), "--json"])
    assert inspected["prefix"]["block_size"] == 512 and inspected["format"] == "mooncake"
    assert inspected["accounting"]["rows_kept"] == 60
    sim = _summary(["simulate", "-t", str(clean), *MODEL, "-g", "h100", "--json"])
    assert sim["requests"] == 60 and sim["prefix_hit_ratio"] > 0
    size = _summary(["size", "-t", str(clean), *SIZE_SMALL, "--json"])
    assert size["input_accounting"]["rows_kept"] == 60 and size["gpus"] >= 1


def test_a_shell_pipe_is_read_like_a_file(tmp_path: Path) -> None:
    gz = tmp_path / "plain.csv.gz"
    gz.write_bytes(gzip.compress(csv("arrival_s,isl,osl", PLAIN_ROWS)))
    cmd = f'"{sys.executable}" -m llmcap trace inspect --json <(zcat "{gz}")'
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["accounting"]["rows_kept"] == 5


# ---------------------------------------------------------------- options and outputs


def _one_line_error(args: list[str], *fragments: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    # the error is the one last line; a command may have said what it read before it (the input's account)
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == lines[-1:] and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    path = tmp_path / "plain.csv"
    path.write_bytes(csv("arrival_s,isl,osl,tenant", [f"{r},prod" for r in PLAIN_ROWS]))
    return path


def test_unknown_column_mapping(plain: Path) -> None:
    for cmd in (["trace", "inspect"], ["trace", "clean", "-o", str(plain.with_suffix(".parquet"))]):
        _one_line_error([*cmd, str(plain), "-c", "prompt=isl"], "unknown canonical column(s) ['prompt']")


def test_output_paths_are_checked_before_any_work(plain: Path, tmp_path: Path) -> None:
    clean = ["trace", "clean", str(plain)]
    _one_line_error([*clean, "-o", str(tmp_path)], "is a directory")
    _one_line_error([*clean, "-o", str(plain)], "is the input file")
    _one_line_error(
        [*clean, "-o", str(tmp_path / "x.parquet"), "--quarantine", str(tmp_path / "x.parquet")], "two outputs"
    )
    _one_line_error([*clean, "-o", str(plain / "under_a_file.parquet")], "cannot be written")
    _one_line_error(["trace", "synth", str(plain), "-o", str(plain), "--rate", "2"], "is the input file")
    _one_line_error(["simulate", "-t", str(plain), *MODEL, "-g", "h100", "--out", str(tmp_path)], "is a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.csv"]  # nothing was written, the source is intact
    assert plain.read_bytes() == csv("arrival_s,isl,osl,tenant", [f"{r},prod" for r in PLAIN_ROWS])


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--exclude", "tenant=(unclosed"], ("pattern", "not a regular expression")),
        (
            ["--exclude", "tenant=(?=prod)x"],
            ("exclude rule tenant=", "not a usable regular expression"),
        ),  # Python's re: fine; RE2: no
    ],
)
def test_bad_exclude_patterns(plain: Path, tmp_path: Path, args: list[str], fragments: tuple[str, ...]) -> None:
    _one_line_error(["trace", "clean", str(plain), "-o", str(tmp_path / "o.parquet"), *args], *fragments)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["size", *SIZE_SMALL, "--target-rps", "inf"], "--target-rps must be a positive finite number"),
        (["size", *SIZE_SMALL, "--target-rps", "nan"], "--target-rps must be a positive finite number"),
        (["size", *SIZE_SMALL, "--target-rps", "1e12"], "outside the plausible"),
        (["simulate", *MODEL, "-g", "h100", "--rate-scale", "1e-12"], "outside the plausible"),
        (["simulate", *MODEL, "-g", "h100", "--rate-scale", "inf"], "--rate-scale must be a positive finite number"),
    ],
)
def test_absurd_rates_are_errors(plain: Path, args: list[str], fragment: str) -> None:
    cmd, rest = args[0], args[1:]
    _one_line_error([cmd, "-t", str(plain), *rest], fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--rate", "nan"], "--rate must be a positive finite number"),
        (["--rate", "-inf"], "--rate must be a positive finite number"),
        (["--rate", "2", "--arrivals", "poisson", "-n", "-5"], "--requests must be at least 1"),
    ],
)
def test_synth_refuses_bad_numbers_before_writing(plain: Path, tmp_path: Path, args: list[str], fragment: str) -> None:
    out = tmp_path / "synth.parquet"
    _one_line_error(["trace", "synth", str(plain), "-o", str(out), *args], fragment)
    assert not out.exists()


def test_memory_follows_rows_not_the_time_span(plain: Path, tmp_path: Path) -> None:
    series = tmp_path / "ts.parquet"
    # five requests stretched over 42 days: 3.6M one-second rows per replica if the clock decided; it does not
    result = runner.invoke(
        app,
        [
            "simulate",
            "-t",
            str(plain),
            *MODEL,
            "-g",
            "h100",
            "--rate-scale",
            "2e-6",
            "--timeseries-out",
            str(series),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["completed"] == 5
    assert pq.read_metadata(series).num_rows <= 100_002


def test_requests_longer_than_max_model_len_are_rejected_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_bytes(csv("arrival_s,isl,osl", ["0,100,10", "1,5000,100", "2,200,20", "3,900,101"]))
    s = _summary(["simulate", "-t", str(path), *MODEL, "-g", "h100", "--max-model-len", "1000", "--json"])
    assert (s["rejected"], s["rejected_over_max_model_len"], s["completed"]) == (2, 2, 2)
    # by default the limit is the model's own (131,072 for Llama-3.1): nothing here exceeds it
    s = _summary(["simulate", "-t", str(path), *MODEL, "-g", "h100", "--json"])
    assert (s["max_model_len"], s["rejected"]) == (131_072, 0)


# ---------------------------------------------------------------- files that are not plain files, fields that are huge


@pytest.mark.parametrize("cmd", COMMANDS)
def test_links_that_lead_nowhere_say_so(cmd: str, tmp_path: Path) -> None:
    loop, broken = tmp_path / "loop.csv", tmp_path / "broken.csv"
    loop.symlink_to(loop)
    broken.symlink_to(tmp_path / "gone.csv")
    _one_line_error(_command(cmd, loop, tmp_path, ()), f"{loop}: symbolic link loop")
    _one_line_error(_command(cmd, broken, tmp_path, ()), f"{broken}: broken symbolic link (to {tmp_path / 'gone.csv'}")


def test_a_fifo_with_a_writer_is_read_like_a_file(tmp_path: Path) -> None:
    import os
    import threading

    fifo = tmp_path / "trace.csv"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(csv("arrival_s,isl,osl", PLAIN_ROWS),))
    writer.start()
    out = _summary(["trace", "inspect", str(fifo), "--json"])
    writer.join(10)
    assert out["accounting"]["rows_kept"] == 5 and out["duration_s"] == 6.0


@pytest.mark.timeout(60)  # the table layout was quadratic in a label's length: 1 MB took minutes
def test_a_megabyte_label_is_clipped_in_the_table_and_whole_in_the_json(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    huge = "x" * (1 << 20)
    path.write_bytes(csv("arrival_s,isl,osl,tenant", [f"0,10,5,{huge}", "1,10,5,[bold]red"]))
    table = runner.invoke(app, ["trace", "inspect", str(path)])
    assert table.exit_code == 0, table.output
    mix = next(line for line in table.stdout.splitlines() if line.startswith("tenant mix: "))
    shares = sorted(mix.removeprefix("tenant mix: ").split(", "))
    assert shares == ["[bold]red 50.0%", f"{'x' * 47}… 50.0%"]  # markup in a value is shown, not applied
    assert set(_summary(["trace", "inspect", str(path), "--json"])["mix"]["tenant"]) == {huge, "[bold]red"}
