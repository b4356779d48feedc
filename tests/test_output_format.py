"""`--output-format table|json|csv` on the commands that print tables; `--json` stays its short form."""

from __future__ import annotations

import csv
import io
import json

from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.commands._common import flatten
from tests.conftest import TRACES

runner = CliRunner()
PERF = ["perf", "--model", "Llama-3.1-8B", "--gpu", "h100", "--isl", "1000", "--osl", "100"]
MEMORY = ["memory", "--model", "Llama-3.1-8B", "--gpu", "h100"]


def _csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_flatten_names_nested_fields_with_dots_and_keeps_lists_as_json():
    assert flatten({"a": {"b": 1, "c": {"d": None}}, "e": [1, 2], "f": "x"}) == {
        "a.b": 1,
        "a.c.d": "",
        "e": "[1, 2]",
        "f": "x",
    }


def test_perf_and_memory_csv_hold_the_json_figures():
    as_json = json.loads(runner.invoke(app, [*PERF, "--json"]).stdout)
    rows = _csv(runner.invoke(app, [*PERF, "--output-format", "csv"]).stdout)
    assert [int(r["batch"]) for r in rows] == [d["batch"] for d in as_json["decode"]]
    assert [float(r["step_time_s"]) for r in rows] == [d["step_time_s"] for d in as_json["decode"]]
    assert {r["prefill_time_s"] for r in rows} == {repr(as_json["prefill_time_s"])} and rows[0]["tp"] == "1"
    mem = json.loads(runner.invoke(app, [*MEMORY, "--output-format", "json"]).stdout)
    (row,) = _csv(runner.invoke(app, [*MEMORY, "--output-format", "csv"]).stdout)
    assert int(row["kv_tokens_per_instance"]) == mem["kv_tokens_per_instance"] and row["parallelism.tp"] == "1"


def test_simulate_csv_is_one_row_of_the_summary(tmp_path):
    trace = tmp_path / "head.csv"
    trace.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:101]) + "\n")
    args = ["simulate", "--trace", str(trace), "--model", "Llama-3.1-8B", "--gpu", "h100"]
    summary = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    r = runner.invoke(app, [*args, "--output-format", "csv"])
    assert r.exit_code == 0, r.output
    (row,) = _csv(r.stdout)
    assert float(row["ttft_ms.p99"]) == summary["ttft_ms"]["p99"] and int(row["requests"]) == summary["requests"] == 100
    assert float(row["throughput.output_tok_s"]) == summary["throughput"]["output_tok_s"]


def test_one_format_at_a_time_and_only_known_ones():
    both = runner.invoke(app, [*PERF, "--json", "--output-format", "csv"])
    assert both.exit_code == 2 and "--json and --output-format csv ask for two formats" in both.stderr
    unknown = runner.invoke(app, [*MEMORY, "--output-format", "xml"])
    assert unknown.exit_code == 2 and "choose one of table, json, csv" in unknown.stderr
