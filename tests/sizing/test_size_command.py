"""`llmcap size`: the CLI contract (JSON summary, report files, one-line errors)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.trace import ingest
from tests.conftest import TRACES

runner = CliRunner()
ARGS = [
    "--model",
    "Llama-3.1-8B",
    "--gpu",
    "h100",
    "--tp",
    "1",
    "--weight-quant",
    "fp8",
    "--no-pd",
    "--slo-ttft-p99",
    "500",
    "--slo-itl-p99",
    "60",
    "--attainment",
    "0.95",
    "--shortlist",
    "1",
    "--excerpt",
    "200",
]


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
    assert (
        f"/seqs{argv[argv.index('--max-num-seqs') + 1]}/mbt{argv[argv.index('--max-num-batched-tokens') + 1]}/"
        in s["chosen"]
    )


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

    trace = tmp_path / "azure_head.csv"
    trace.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:1501]) + "\n")
    r = runner.invoke(
        app, ["size", "--trace", str(trace), *ARGS, "--out", str(tmp_path / "report"), "--output-format", "csv"]
    )
    assert r.exit_code == 0, r.output
    reader = csv.DictReader(io.StringIO(r.stdout))
    rows = list(reader)
    parquet = pq.read_table(tmp_path / "report" / "capacity.parquet")
    table = parquet.to_pylist()
    # `chosen` first, then the capacity table's own columns in their order
    assert reader.fieldnames == ["chosen", *parquet.column_names]
    assert [row["candidate"] for row in rows] == [t["candidate"] for t in table] and len(rows) >= 2
    assert [float(row["max_rps"]) for row in rows] == [t["max_rps"] for t in table]
    # exactly one row is chosen, and it is the plan's configuration (not always the first row: the table is in goodput order)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert {row["chosen"] for row in rows} == {"True", "False"}
    (chosen,) = [row for row in rows if row["chosen"] == "True"]
    assert (chosen["candidate"], chosen["mode"]) == (summary["chosen"], summary["mode"])


def test_a_plan_over_the_cost_limit_is_no_answer_and_exits_1(tmp_path):
    trace = tmp_path / "azure_head.csv"
    trace.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:1501]) + "\n")
    out = tmp_path / "report"
    r = runner.invoke(
        app, ["size", "--trace", str(trace), *ARGS, "--max-usd-per-hour", "0.5", "--out", str(out), "--json"]
    )
    assert r.exit_code == 1, r.output
    s = json.loads(r.stdout)
    assert (
        s["verdict"] == "fails" and s["scenarios_pass"] is False and s["usd_per_hour"] > 0.5
    )  # one H100 costs more than $0.50/h
    assert all(not f["passes"] and f["cost_limit_usd_per_hour"] == 0.5 for f in s["finalists"])
    assert "error: no plan passes every scenario" in r.stderr and "not an answer" in r.stderr
    assert json.loads((out / "summary.json").read_text())["verdict"] == "fails"
    assert (
        "NO PLAN PASSES" in (out / "capacity.md").read_text()
        and 'class="answer loud"' in (out / "capacity.html").read_text()
    )


def _azure_head(tmp_path):
    trace = tmp_path / "azure_head.csv"
    trace.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:1501]) + "\n")
    return trace


def test_piped_table_shows_every_name_whole_and_no_zero_rate(tmp_path, monkeypatch):
    # CliRunner's stdout is no terminal, as `llmcap size ... | less` or `> plan.txt`: rich would lay it out in 80 columns
    monkeypatch.delenv("COLUMNS", raising=False)
    out = tmp_path / "report"
    r = runner.invoke(app, ["size", "--trace", str(_azure_head(tmp_path)), *ARGS, "--out", str(out)])
    assert r.exit_code == 0, r.output
    chosen = json.loads((out / "summary.json").read_text())["chosen"]
    assert chosen.startswith("H100-SXM-80GB/fp8/kv-") and chosen.endswith("/blk16")
    assert "…" not in r.stdout and f"chosen: {chosen} (aggregated)" in r.stdout
    table = pq.read_table(out / "capacity.parquet").to_pylist()
    lines = {t["candidate"]: [ln for ln in r.stdout.splitlines() if f"│ {t['candidate']} " in ln] for t in table}
    assert all(len(found) == 1 for found in lines.values()), lines  # each name whole, on one line
    stopped = [t for t in table if t["max_rps"] == 0]
    assert stopped and len(stopped) < len(table)  # this run stops some candidates below the best: the case to show
    for t in table:
        cells = [c.strip() for c in lines[t["candidate"]][0].split("│")]
        rate = cells[4]  # │ candidate │ mode │ P:D │ max RPS/unit │ ...
        if t["max_rps"] == 0:
            assert rate.startswith("— stopped: fails at ") and rate.endswith(" req/s, needed to beat the best"), rate
        else:
            assert rate == f"{t['max_rps']:.3g}"


def test_a_zero_rate_cell_says_why_for_every_status():
    from llmcap.commands._size_print import max_rps_cell

    def row(status):
        return {"candidate": "c", "mode": "aggregated", "max_rps": 0.0, "search_status": status}

    assert max_rps_cell({**row("converged"), "max_rps": 12.34}, {}) == "12.3"
    assert max_rps_cell(row("below_floor"), {}) == "— stopped: cannot beat the best"
    assert max_rps_cell(row("infeasible"), {}) == "— no rate meets the SLOs"
    assert max_rps_cell(row("max_evaluations"), {}) == "— no feasible rate found"
    assert max_rps_cell(row("at_max_rate"), {}) == "— no rate (at max rate)"


def test_every_ruled_out_candidate_shows_its_reasons(tmp_path, monkeypatch):
    # TP 3 divides none of Llama-3.1-8B's heads: step 2 rules out every candidate before any simulation
    monkeypatch.delenv("COLUMNS", raising=False)  # piped: full names and reasons on one line each (a set COLUMNS wins)
    trace = _azure_head(tmp_path)
    args = ["size", "--trace", str(trace), *ARGS]
    args[args.index("--tp") + 1] = "3"
    j = runner.invoke(app, [*args, "--json"])
    assert j.exit_code == 2, j.output
    doc = json.loads(j.stdout)
    n = len(doc["ruled_out"])
    assert doc["feasible"] is False and n == 8  # 2 KV dtypes x 4 chunk sizes, aggregated only (--no-pd)
    assert all(
        "32 attention heads are not divisible by TP=3" in c["reasons"] and "/tp3pp1ep1/" in c["candidate"]
        for c in doc["ruled_out"]
    )
    (line,) = j.stderr.strip().splitlines()
    assert line == f"error: {doc['error']}" and "see its reasons" not in line
    assert f"step 2 ruled out all {n} candidates: 32 attention heads are not divisible by TP=3 ({n} of {n})" in line
    # the table names each candidate with its reasons, the error line follows on stderr
    t = runner.invoke(app, args)
    assert t.exit_code == 2 and t.stderr.strip().splitlines()[-1] == line
    for c in doc["ruled_out"]:
        (shown,) = [ln for ln in t.stdout.splitlines() if f"│ {c['candidate']} " in ln]
        assert (
            "32 attention heads are not divisible by TP=3" in shown
            and "MLP width 14336 is not divisible by TP=3" in shown
        )


def test_the_ruled_out_line_counts_each_reason_once_per_candidate_and_says_how_many_it_leaves_out():
    import pandas as pd

    from llmcap.sizing.plan import no_feasible_candidate

    reasons = ["a; b", "a; a", "c", "d", "e", "f"]  # `a` twice in one row still rules out one candidate
    line = no_feasible_candidate(pd.DataFrame({"feasible": [False] * 6, "reasons": reasons}))
    assert (
        line
        == "no feasible candidate to size: step 2 ruled out all 6 candidates: a (2 of 6); b (1 of 6); c (1 of 6); d (1 of 6); and 2 more reason(s)"
    )
    assert (
        no_feasible_candidate(pd.DataFrame({"feasible": [], "reasons": []}))
        == "no feasible candidate to size: the candidates table has no rows"
    )
