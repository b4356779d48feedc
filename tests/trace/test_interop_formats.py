"""Other tools' request files read without a detour by every command: a `vllm bench serve --save-detailed`
result (its send times as arrivals, failed requests quarantined) and guidellm's request data (lengths
only: arrivals generated, and the account line says how)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.trace import ingest
from tests.conftest import ROOT

runner = CliRunner()
VLLM_BENCH = ROOT / "tests" / "fixtures" / "vllm_bench" / "vllm-0.32.0-cpu-tiny-llama-random.json"
SIM = ["-m", "Llama-3.1-8B", "-g", "h100", "--json"]


def _json(args: list[str]) -> dict:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_vllm_bench_detailed_result_is_a_trace() -> None:
    doc = json.loads(VLLM_BENCH.read_text())
    result = ingest(VLLM_BENCH)
    assert result.report.source_format == "vllm-bench" and result.report.arrival_column == "start_times"
    order = sorted(range(len(doc["start_times"])), key=lambda i: doc["start_times"][i])
    assert result.trace.column("isl").to_pylist() == [doc["input_lens"][i] for i in order]
    assert result.trace.column("osl").to_pylist() == [doc["output_lens"][i] for i in order]
    arrival = result.trace.column("arrival_s").to_pylist()
    assert arrival[-1] == max(doc["start_times"]) - min(doc["start_times"])
    sim = _json(["simulate", "-t", str(VLLM_BENCH), *SIM])
    assert sim["requests"] == len(doc["input_lens"]) and sim["input_accounting"]["source_format"] == "vllm-bench"


def test_vllm_bench_failed_requests_and_older_files(tmp_path: Path) -> None:
    doc = json.loads(VLLM_BENCH.read_text())
    doc["output_lens"][3] = 0
    doc["errors"][3] = "Internal Server Error"
    del doc["start_times"]  # vLLM before send times were saved; pretty-printed, too
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc, indent=2))
    result = ingest(path)
    assert result.report.by_reason == {"failed_request": 1}
    assert result.report.generated_arrivals and result.report.rows_kept == len(doc["input_lens"]) - 1


def test_guidellm_request_data_is_lengths_with_generated_arrivals(tmp_path: Path) -> None:
    rows = [{"prompt": f"p{k}", "prompt_tokens_count": 100 + 10 * k, "output_tokens_count": 20 + k} for k in range(30)]
    path = tmp_path / "guidellm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(app, ["simulate", "-t", str(path), "--arrival-rate", "3", *SIM[:-1]])
    assert result.exit_code == 0, result.output
    assert "arrivals GENERATED: poisson at 3 req/s, seed 0" in result.stderr
    acc = _json(["trace", "inspect", str(path), "--json"])["accounting"]
    assert (acc["source_format"], acc["rows_kept"], acc["generated_arrivals"]) == ("guidellm", 30, True)
