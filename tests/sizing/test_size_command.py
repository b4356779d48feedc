"""`llmcap size`: the CLI contract (JSON summary, report files, one-line errors)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.trace import ingest
from tests.conftest import TRACES

runner = CliRunner()
ARGS = ["--model", "Llama-3.1-8B", "--gpu", "h100", "--tp", "1", "--weight-quant", "fp8", "--no-pd",
        "--slo-ttft-p99", "500", "--slo-itl-p99", "60", "--attainment", "0.95", "--shortlist", "1", "--excerpt", "200"]  # fmt: skip


def test_size_json_and_report(tmp_path):
    # 1,500 Azure conversation requests, re-written as an Azure-format CSV the command reads like any trace
    src = TRACES["azure_conv"]
    lines = src.read_text().splitlines()[:1501]
    trace = tmp_path / "azure_head.csv"
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "report"
    r = runner.invoke(app, ["size", "--trace", str(trace), *ARGS, "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["target_rps"] > 0 and s["gpus"] >= 1 and s["mode"] == "aggregated"
    assert s["chosen"].startswith("H100-SXM-80GB/fp8/")
    assert set(s["report"]) == {"parquet", "md", "html", "summary"}
    assert json.loads((out / "summary.json").read_text()) == s  # the summary file is what --json prints
    assert (out / "capacity.html").read_text().count("<img") == 5
    assert ingest(trace).report.rows_kept == 1500
    # the chosen configuration as the vllm serve command that deploys it
    (serve,) = s["vllm_serve"]
    assert serve["pool"] == "instances" and serve["instances"] == s["instances"]
    argv = serve["argv"]
    assert argv[:3] == ["vllm", "serve", "Llama-3.1-8B"] and argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert argv[argv.index("--quantization") + 1] == "fp8" and "/fp8/" in s["chosen"]
    assert f"/seqs{argv[argv.index('--max-num-seqs') + 1]}/mbt{argv[argv.index('--max-num-batched-tokens') + 1]}/" in s["chosen"]


def test_size_bad_trace_is_one_line_error(tmp_path):
    bad = tmp_path / "empty.csv"
    bad.write_text("")
    r = runner.invoke(app, ["size", "--trace", str(bad), *ARGS])
    assert r.exit_code == 2
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1


def test_size_slo_options_are_checked_before_any_work(tmp_path):
    base = [a for a in ARGS if a not in ("--slo-ttft-p99", "500", "--slo-itl-p99", "60")]
    missing = tmp_path / "nope.csv"  # never read: the SLO options fail first
    for extra, message in (
        ([], "no SLO target"),
        (["--slo-ttft-p99", "500", "--goodput", "ttft:400"], "--slo-ttft-p99 and --goodput ttft:MS both set"),
        (["--goodput", "itl:50", "--itl-stat", "token_p98"], "--itl-stat 'token_p98'"),
        (["--goodput", "ttft:-3"], "positive, finite"),
    ):
        r = runner.invoke(app, ["size", "--trace", str(missing), *base, *extra])
        assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, (extra, r.stderr)


def test_size_csv_is_the_capacity_table(tmp_path):
    import csv
    import io

    import pyarrow.parquet as pq

    trace = tmp_path / "azure_head.csv"
    trace.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:1501]) + "\n")
    r = runner.invoke(app, ["size", "--trace", str(trace), *ARGS, "--out", str(tmp_path / "report"), "--output-format", "csv"])
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    table = pq.read_table(tmp_path / "report" / "capacity.parquet").to_pylist()
    assert [row["candidate"] for row in rows] == [t["candidate"] for t in table] and len(rows) >= 1
    assert [float(row["max_rps"]) for row in rows] == [t["max_rps"] for t in table]


def test_a_plan_over_the_cost_limit_is_no_answer_and_exits_1(tmp_path):
    trace = tmp_path / "azure_head.csv"
    trace.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:1501]) + "\n")
    out = tmp_path / "report"
    r = runner.invoke(app, ["size", "--trace", str(trace), *ARGS, "--max-usd-per-hour", "0.5", "--out", str(out), "--json"])
    assert r.exit_code == 1, r.output
    s = json.loads(r.stdout)
    assert s["verdict"] == "fails" and s["scenarios_pass"] is False and s["usd_per_hour"] > 0.5  # one H100 costs more than $0.50/h
    assert all(not f["passes"] and f["cost_limit_usd_per_hour"] == 0.5 for f in s["finalists"])
    assert "error: no plan passes every scenario" in r.stderr and "not an answer" in r.stderr
    assert json.loads((out / "summary.json").read_text())["verdict"] == "fails"
    assert "NO PLAN PASSES" in (out / "capacity.md").read_text() and 'class="answer loud"' in (out / "capacity.html").read_text()
