"""The client's cap on output tokens (`max_tokens`): read where a trace has it, optional per request, checked
against the output it capped, kept in the canonical trace (null where unknown), and read back from a file
written before the column existed."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from llmcap.trace import ingest, load_trace, write_table
from llmcap.trace.schema import CANONICAL_SCHEMA
from tests._size_cli import size_args


def _csv(path: Path, rows: list[str]) -> Path:
    path.write_text("arrival_s,isl,osl,max_tokens\n" + "\n".join(rows) + "\n")
    return path


def test_a_cap_is_kept_checked_and_optional(tmp_path: Path) -> None:
    rows = [
        "0.0,100,10,10",  # 0: kept: the output reached its cap exactly
        "1.0,100,10,",  # 1: kept: no cap stated (null)
        "2.0,100,10,4096",  # 2: kept
        "3.0,100,11,10",  # 3: osl_above_max_tokens: 11 > 10
        "4.0,100,10,0",  # 4: max_tokens_invalid: below 1
        "5.0,100,10,12.5",  # 5: max_tokens_invalid: not a whole number
        "6.0,100,10,inf",  # 6: max_tokens_invalid: not finite
        "7.0,100,0,10",  # 7: osl_below_1: the output's own rule comes first
        "8.0,100,1,1",  # 8: kept: a cap of 1, the least allowed, for a one-token output
    ]
    result = ingest(_csv(tmp_path / "capped.csv", rows))
    assert result.report.rows_in == 9 and result.report.rows_kept == 4 and result.report.rows_quarantined == 5
    assert result.trace.column("max_tokens").to_pylist() == [10, None, 4096, 1]
    assert result.trace.column("osl").to_pylist() == [10, 10, 10, 1]
    q = result.quarantine.to_pydict()
    assert dict(zip(q["source_row"], zip(q["reason"], q["detail"], strict=True), strict=True)) == {
        3: ("osl_above_max_tokens", "osl=11 > max_tokens=10"),
        4: ("max_tokens_invalid", "max_tokens=0"),
        5: ("max_tokens_invalid", "max_tokens=12.5"),
        6: ("max_tokens_invalid", "max_tokens=inf"),
        7: ("osl_below_1", "osl=0"),
    }


def test_a_trace_without_caps_has_the_column_null(tmp_path: Path) -> None:
    path = tmp_path / "plain.csv"
    path.write_text("arrival_s,isl,osl\n0.0,100,10\n1.0,100,20\n")
    assert ingest(path).trace.column("max_tokens").null_count == 2


def test_a_trace_written_before_the_column_reads_with_it_null(tmp_path: Path) -> None:
    table = ingest(_csv(tmp_path / "capped.csv", ["0.0,100,10,10", "1.0,200,20,64"])).trace
    current = write_table(table, tmp_path / "now.parquet")
    assert load_trace(current).column("max_tokens").to_pylist() == [10, 64]
    older = tmp_path / "trace1.parquet"  # the same trace as trace/1 wrote it: no max_tokens column
    pq.write_table(table.drop_columns(["max_tokens"]), older)
    back = load_trace(older)
    assert back.schema.names == CANONICAL_SCHEMA.names and back.column("max_tokens").null_count == 2
    assert back.drop_columns(["max_tokens"]).equals(table.drop_columns(["max_tokens"]))
    assert load_trace(older, columns=["isl", "max_tokens"]).column("max_tokens").type == pa.int64()


def test_the_workload_summary_says_what_the_caps_would_reserve(tmp_path: Path) -> None:
    from llmcap.trace.params import CharacteriseParams
    from llmcap.trace.stats import characterise

    table = ingest(_csv(tmp_path / "capped.csv", ["0.0,100,10,10", "1.0,100,10,", "2.0,100,10,4096"])).trace
    caps = characterise(table, CharacteriseParams(percentiles=[50.0]))["max_tokens"]
    # two of three requests state a cap: 10 and 4,096 over 10 output tokens each → ratios 1 and 409.6
    assert caps == {
        "requests": 2,
        "share": 2 / 3,
        "cap_over_osl": {"p50": (1 + 409.6) / 2},
        "reserved_over_real": (10 + 4096) / 20,
    }
    assert "max_tokens" not in characterise(
        table.set_column(table.schema.get_field_index("max_tokens"), "max_tokens", pa.nulls(3, pa.int64())),
        CharacteriseParams(),
    )


def test_the_plan_says_what_a_reserving_scheduler_was_assumed_to_know() -> None:
    from llmcap.planning import reservation_note

    def trace(caps: list[int | None]) -> pa.Table:
        return pa.table({"max_tokens": pa.array(caps, pa.int64())})

    assert reservation_note(trace([None, None]), "trtllm-guaranteed-no-evict") == (
        "output lengths: the trace states no max_tokens, so admission trtllm-guaranteed-no-evict was simulated reserving each "
        "request's real output length, which no engine knows in advance (optimistic)"
    )
    assert reservation_note(trace([10, 20]), "sglang") == (
        "output lengths: admission sglang reserves each request's max_tokens (every request states one), not the output to come"
    )
    assert reservation_note(trace([10, None, None]), "sglang").startswith(
        "output lengths: admission sglang reserves max_tokens for the 1 of 3 requests stating one, and for the rest their real output"
    )
    assert reservation_note(trace([10, None]), "vllm") == (
        "output lengths: admission vllm reserves nothing ahead; max_tokens (1 of 2 requests state one) only bounds max_model_len"
    )


def test_size_fits_max_model_len_to_the_caps_and_says_what_it_reserved(tmp_path: Path, monkeypatch) -> None:
    import json

    from typer.testing import CliRunner

    from llmcap.cli import app

    monkeypatch.delenv("COLUMNS", raising=False)
    # 60 requests: prompts 500..559, outputs 50..109, each capped at 4 × its output (200..436)
    rows = [f"{i * 0.5},{500 + i},{50 + i},{4 * (50 + i)}" for i in range(60)]
    trace = _csv(tmp_path / "capped.csv", rows)
    args = size_args("--admission-policy", "trtllm-guaranteed-no-evict", trace=trace, excerpt=40)
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert (
        s["max_model_len"] == 559 + 436 and s["rejected_over_max_model_len"] == 0
    )  # the longest prompt + the largest cap
    assert (
        "output lengths: admission trtllm-guaranteed-no-evict reserves each request's max_tokens (every request states one), "
        "not the output to come"
    ) in s["notes"]
