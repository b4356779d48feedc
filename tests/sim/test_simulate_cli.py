"""`llmcap simulate` in process: the JSON contract and one-line errors (exit code 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.sim import REQUEST_SCHEMA
from llmcap.trace import write_table
from tests.sim._workloads import canonical, random_trace

runner = CliRunner()
BASE = ["simulate", "--model", "Llama-3.1-8B", "--gpu", "h100"]


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import numpy as np

    return write_table(
        canonical(random_trace(np.random.default_rng(0), 200)), tmp_path_factory.mktemp("sim") / "trace.parquet"
    )


def test_json_summary_and_records(trace_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "records.parquet"
    result = runner.invoke(
        app, [*BASE, "--trace", str(trace_file), "--replicas", "2", "--rate-scale", "2", "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert s["requests"] == 200 and s["completed"] == 200
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        assert set(s[key]) == {"p50", "p90", "p99"} and all(isinstance(v, float) for v in s[key].values()), key
    for key in ("duration_s", "prefix_hit_ratio", "wall_s", "requests_per_wall_s"):
        assert isinstance(s[key], float), key
    assert set(s["throughput"]) == {"output_tok_s", "req_s"} and isinstance(s["preemptions"], int)
    assert pq.read_table(out).schema.remove_metadata() == REQUEST_SCHEMA


def test_pd_and_router_options(trace_file: Path) -> None:
    result = runner.invoke(
        app, [*BASE, "--trace", str(trace_file), "--pd", "1:2", "--router", "prefix_aware", "--json"]
    )
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert s["deployment"] == "P/D 1:2" and s["completed"] == 200


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pd", "2"], "--pd must be P:D"),
        (["--router", "random"], "--router must be one of"),
        (["--rate-scale", "0"], "--rate-scale must be a positive finite number"),
        (["--max-num-seqs", "512", "--max-num-batched-tokens", "256"], "max_num_batched_tokens"),
        (["--model", "No-Such-Model"], "No-Such-Model"),
        (["--goodput", "ttft=500"], "expected KEY:MS"),
        (["--goodput", "ttft:fast"], "is not a number"),
        (["--goodput", "ttft:500 ttft:600"], "ttft is given twice"),
        (["--goodput", "itl:50", "--itl-stat", "p95"], "--itl-stat 'p95'"),
    ],
)
def test_bad_input_is_one_line_exit_2(trace_file: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, [*BASE, "--trace", str(trace_file), *args, "--json"])
    assert result.exit_code == 2, result.output
    assert (
        message in result.stderr and len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    )


def test_missing_trace_file(tmp_path: Path) -> None:
    result = runner.invoke(app, [*BASE, "--trace", str(tmp_path / "nope.jsonl"), "--json"])
    assert result.exit_code == 2 and "nope.jsonl: file not found" in result.stderr


def test_goodput_as_vllm_counts_it(trace_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "records.parquet"
    args = ["--trace", str(trace_file), "--rate-scale", "3", "--out", str(out), "--json"]
    result = runner.invoke(app, [*BASE, *args, "--goodput", "ttft:12 tpot:6.5", "--goodput", "e2el:300"])
    assert result.exit_code == 0, result.output
    g = json.loads(result.stdout)["goodput"]
    rec = pq.read_table(out).to_pandas()
    first, finish, osl = rec["first_token_s"], rec["finish_s"], rec["osl"]
    tpot = ((finish - first) / (osl - 1)).where(osl > 1, 0.0)  # one-token requests have no gaps to miss
    good = (
        (rec["status"] == "ok")
        & (first - rec["arrival_s"] <= 0.012)
        & (tpot <= 0.0065)
        & (finish - rec["arrival_s"] <= 0.3)
    )
    assert 0 < g["good"] < g["requests"] == 200  # the targets bite on some requests, not all
    assert g["good"] == int(good.sum()) and g["attainment"] == pytest.approx(good.mean())
    assert set(g["slo_definitions"]) == {"ttft", "tpot", "e2el", "attainment"} and g["token_itl"] is None


def test_token_level_itl_goodput(trace_file: Path) -> None:
    result = runner.invoke(
        app, [*BASE, "--trace", str(trace_file), "--goodput", "itl:1000", "--itl-stat", "token_p99", "--json"]
    )
    assert result.exit_code == 0, result.output
    g = json.loads(result.stdout)["goodput"]
    assert g["good"] == g["requests"]  # a token-level target judges the run, no request
    assert g["token_itl"].startswith("ITL token-level P99") and g["token_itl"].endswith("met")
