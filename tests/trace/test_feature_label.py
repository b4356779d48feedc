"""The request's feature class (`feature`: structured output, logprobs, beam, speculative decoding, multimodal, …),
a label like tenant: read from a `feature` column or a mapped one, kept in the canonical trace (trace/3; an older file
reads with it null), shown in the label mix, usable by --exclude, and said in the plan's notes."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.planning import mixed_traffic
from llmcap.trace import ingest, load_trace, write_table
from llmcap.trace.params import TraceParams
from llmcap.trace.schema import CANONICAL_SCHEMA, SCHEMA_VERSION

FEATURES = ["json_schema", "", "logprobs", "", "beam", "", "image", ""]  # every other request plain (no feature)


def _csv(path: Path, header: str = "feature") -> Path:
    rows = "".join(f"{i * 0.5},{100 + i},{10 + i},{f}\n" for i, f in enumerate(FEATURES))
    path.write_text(f"arrival_s,isl,osl,{header}\n{rows}")
    return path


def test_a_feature_column_is_kept_as_a_label(tmp_path) -> None:
    trace = ingest(_csv(tmp_path / "t.csv")).trace
    assert SCHEMA_VERSION == "trace/3" and trace.schema.names == CANONICAL_SCHEMA.names
    assert trace.column("feature").to_pylist() == [f or None for f in FEATURES]  # an empty field: no feature
    path = tmp_path / "mapped.csv"
    mapped = ingest(_csv(path, "mode"), TraceParams(file=str(path), columns={"feature": "mode"})).trace
    assert mapped.column("feature").to_pylist() == trace.column("feature").to_pylist()


def test_the_label_mix_shows_it_and_exclude_takes_it(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    path = _csv(tmp_path / "t.csv")
    r = CliRunner().invoke(app, ["trace", "inspect", str(path), "--json"])
    assert r.exit_code == 0, r.output
    # 8 requests: 4 without a feature, one of each of the four features
    assert json.loads(r.stdout)["mix"]["feature"] == {
        "(none)": 0.5,
        "beam": 0.125,
        "image": 0.125,
        "json_schema": 0.125,
        "logprobs": 0.125,
    }
    r = CliRunner().invoke(app, ["trace", "inspect", str(path)])
    assert "feature mix:" in r.stdout
    out = tmp_path / "clean.parquet"
    r = CliRunner().invoke(
        app, ["trace", "clean", str(path), "-o", str(out), "--exclude", "feature=beam|image", "--json"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["by_reason"] == {"test_traffic": 2}
    assert pq.read_table(out).column("feature").to_pylist() == ["json_schema", None, "logprobs", None, None, None]


def test_an_older_trace_reads_with_no_feature(tmp_path) -> None:
    table = ingest(_csv(tmp_path / "t.csv")).trace
    older = tmp_path / "trace2.parquet"  # as trace/2 wrote it: no feature column
    pq.write_table(table.drop_columns(["feature"]), older)
    back = load_trace(older)
    assert back.schema.names == CANONICAL_SCHEMA.names and back.column("feature").null_count == len(FEATURES)
    assert ingest(older).trace.column("feature").null_count == len(
        FEATURES
    )  # and through the reader every command uses
    oldest = tmp_path / "trace1.parquet"  # trace/1: neither max_tokens nor feature
    pq.write_table(table.drop_columns(["feature", "max_tokens"]), oldest)
    assert (
        load_trace(oldest).column("max_tokens").null_count
        == load_trace(oldest).column("feature").null_count
        == len(FEATURES)
    )
    assert (
        load_trace(write_table(table, tmp_path / "now.parquet")).column("feature").to_pylist()
        == table.column("feature").to_pylist()
    )


def test_the_plan_says_features_are_priced_as_plain_requests(tmp_path) -> None:
    notes = mixed_traffic(ingest(_csv(tmp_path / "t.csv")).trace, "Llama-3.1-8B")
    (note,) = notes
    assert note.startswith(
        "request features ((none) 50%, beam 12%, image 12%, json_schema 12%, logprobs 12%) are planned at Llama-3.1-8B's plain step times"
    )
    plain = tmp_path / "plain.csv"
    plain.write_text("arrival_s,isl,osl\n0,100,10\n1,100,10\n")
    assert mixed_traffic(ingest(plain).trace, "Llama-3.1-8B") == []
