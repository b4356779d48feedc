"""`llmcap reconcile`: the one-screen summary and --json on files, diagnosis with a series, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.reconcile.series import to_table
from tests.reconcile._records import pair_of

runner = CliRunner()


def files(tmp_path: Path, scale) -> tuple[Path, Path]:
    measured, predicted = pair_of(scale)
    m, p = tmp_path / "measured.parquet", tmp_path / "predicted.parquet"
    pq.write_table(measured, m)
    pq.write_table(predicted, p)
    return m, p


def test_summary_and_json(tmp_path: Path) -> None:
    m, p = files(tmp_path, lambda isl: np.full(isl.size, 1.2))
    shown = runner.invoke(app, ["reconcile", "--measured", str(m), "--predicted", str(p)])
    assert shown.exit_code == 0, shown.output
    assert "correction: step time x 1.19" in shown.output and "300 paired" in shown.output  # 1.2 with 3% noise
    out = runner.invoke(app, ["reconcile", "-m", str(m), "-p", str(p), "--json"])
    s = json.loads(out.stdout)
    assert [b["decision"] for b in s["reconciliation"]["buckets"]] == ["correct"] * 3
    assert s["reconciliation"]["corrections"][0]["min_context"] == 0 and s["diagnosis"] is None


def test_with_a_metric_series(tmp_path: Path) -> None:
    m, p = files(tmp_path, lambda isl: np.ones(isl.size))
    series = to_table(
        [
            (
                float(t),
                {
                    ("vllm:num_requests_waiting", "0"): 5.0 if t >= 20 else 0.0,
                    ("vllm:kv_cache_usage_perc", "0"): 0.3,
                    ("vllm:num_preemptions_total", "0"): 0.0,
                },
            )
            for t in range(60)
        ]
    )
    path = tmp_path / "series.parquet"
    pq.write_table(series, path)
    out = runner.invoke(app, ["reconcile", "-m", str(m), "-p", str(p), "--metrics", str(path), "--json"])
    assert out.exit_code == 0, out.output
    findings = json.loads(out.stdout)["diagnosis"]["findings"]
    assert [(f["kind"], f["window_s"]) for f in findings] == [("compute_bound", [20.0, 59.0])]
    assert "correlation, not a proven cause" in findings[0]["caveat"]


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    m, p = files(tmp_path, lambda isl: np.ones(isl.size))
    missing = runner.invoke(app, ["reconcile", "-m", str(tmp_path / "nope.parquet"), "-p", str(p)])
    assert missing.exit_code == 2 and "nope.parquet: file not found" in missing.output
    bad = runner.invoke(app, ["reconcile", "-m", str(m), "-p", str(p), "--isl-edges", "100,50"])
    assert bad.exit_code == 2 and "isl_edges" in bad.output and "Traceback" not in bad.output
    pq.write_table(pq.read_table(m).drop_columns(["ttft_s"]), m)
    short = runner.invoke(app, ["reconcile", "-m", str(m), "-p", str(p)])
    assert short.exit_code == 2 and "missing column(s) ttft_s" in short.output
