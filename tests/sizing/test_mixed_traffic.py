"""A trace that mixes models or adapters is not silently sized as one model: the plan says what it leaves out."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from tests._size_cli import size_args
from tests.conftest import TRACES


@pytest.fixture
def canonical(tmp_path, monkeypatch) -> pa.Table:
    monkeypatch.delenv("COLUMNS", raising=False)
    head = tmp_path / "azure_head.csv"
    head.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:301]) + "\n")
    assert CliRunner().invoke(app, ["trace", "clean", str(head), "-o", str(tmp_path / "clean.parquet")]).exit_code == 0
    return pq.read_table(tmp_path / "clean.parquet")


def _size(tmp_path, table: pa.Table) -> tuple[dict, str]:
    path = tmp_path / "labelled.parquet"
    pq.write_table(table, path)
    r = CliRunner().invoke(
        app,
        size_args(trace=path, slos=("--slo-ttft-p99", "2000")),
    )
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), r.stderr


def _labelled(table: pa.Table, name: str, values: list[str]) -> pa.Table:
    return table.set_column(
        table.schema.get_field_index(name), name, pa.array([values[i % len(values)] for i in range(table.num_rows)])
    )


def test_two_models_in_one_trace_are_said_to_share_nothing(tmp_path, canonical) -> None:
    summary, stderr = _size(tmp_path, _labelled(canonical, "model", ["chat", "code"]))
    (note,) = [n for n in summary["notes"] if "mixes 2 models" in n]
    assert "chat 50%, code 50%" in note and "share no weights or KV" in note and "warning:" in stderr


def test_adapters_are_said_to_be_unplanned(tmp_path, canonical) -> None:
    summary, _ = _size(tmp_path, _labelled(canonical, "adapter", ["lora-a", "lora-b", "lora-c"]))
    assert any(n.startswith("3 adapters (lora-a 33%, lora-b 33%, lora-c 33%)") for n in summary["notes"])


def test_one_model_says_nothing(tmp_path, canonical) -> None:
    summary, stderr = _size(tmp_path, _labelled(canonical, "model", ["chat"]))
    assert not any("models" in n or "adapters" in n for n in summary["notes"]) and "warning:" not in stderr
