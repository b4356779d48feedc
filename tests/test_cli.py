"""The `llmcap` command line, in process (typer's CliRunner) — the JSON contract other tools rely on."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.trace import load_trace
from tests.conftest import TRACES

runner = CliRunner()


def test_inspect_json_contract() -> None:
    result = runner.invoke(app, ["trace", "inspect", str(TRACES["mooncake_conversation"]), "--json"])
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert s["rows"] == 12_031 and s["format"] == "mooncake"
    for key in ("duration_s", "mean_rps", "corr_pearson", "corr_spearman", "interarrival_cv"):
        assert isinstance(s[key], float), key
    for key in ("isl", "osl"):
        assert set(s[key]) >= {"mean", "p50", "p90", "p99", "max"}
    assert set(s["rps_windows"]) == {"1s", "60s", "300s"}
    for window in s["rps_windows"].values():
        assert set(window) >= {"p50", "p90", "p99", "max"}
    assert s["prefix"]["block_size"] == 512
    assert round(s["prefix"]["ideal_hit_ratio"], 3) == 0.374
    assert round(s["prefix"]["requests_reusing_ge1_block"], 4) == 0.9999


def test_inspect_json_without_hashes_has_no_prefix() -> None:
    result = runner.invoke(app, ["trace", "inspect", str(TRACES["azure_conv"]), "--json"])
    s = json.loads(result.stdout)
    assert s["rows"] == 19_366 and "prefix" not in s


def test_inspect_human_output_mentions_the_key_figures() -> None:
    result = runner.invoke(app, ["trace", "inspect", str(TRACES["azure_conv"])])
    assert result.exit_code == 0
    assert "19,366 requests" in result.stdout and "Spearman 0.073" in result.stdout


def test_clean_writes_trace_and_quarantine(tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    # Mooncake has no request ids: its two equal rows (lines 7728/7733) are two requests by default ...
    result = runner.invoke(app, ["trace", "clean", str(TRACES["mooncake_conversation"]), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["rows_in"], report["rows_kept"], report["rows_quarantined"]) == (12_031, 12_031, 0)
    assert load_trace(out).num_rows == 12_031
    # ... and one, quarantined with its line, when strict deduplication is asked for.
    args = [
        "trace",
        "clean",
        str(TRACES["mooncake_conversation"]),
        "-o",
        str(out),
        "--duplicates",
        "identical",
        "--json",
    ]
    report = json.loads(runner.invoke(app, args).stdout)
    assert (report["rows_in"], report["rows_kept"], report["rows_quarantined"]) == (12_031, 12_030, 1)
    assert report["by_reason"] == {"duplicate": 1}
    assert load_trace(out).num_rows == 12_030
    assert pq.read_table(tmp_path / "t.quarantine.parquet").column("line").to_pylist() == [7_733]


def test_synth_rescale_and_resample(tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    result = runner.invoke(app, ["trace", "synth", str(TRACES["azure_conv"]), "-o", str(out), "--rate", "20", "--json"])
    assert result.exit_code == 0, result.output
    assert round(json.loads(result.stdout)["mean_rps"], 6) == 20.0
    out2 = tmp_path / "g.parquet"
    args = [
        "trace",
        "synth",
        str(out),
        "-o",
        str(out2),
        "--rate",
        "3",
        "--arrivals",
        "gamma",
        "--cv",
        "2",
        "-n",
        "4000",
        "--json",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"] == 4_000


def test_user_error_exit_code_and_single_line(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["trace", "synth", str(TRACES["azure_conv"]), "-o", str(tmp_path / "x.parquet"), "--rate", "-1"]
    )
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == ["error: --rate must be a positive finite number, got -1.0"]
