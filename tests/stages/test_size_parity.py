"""`llmcap size` and the pipeline's size stage, given the same trace, candidates, params.yaml and
step_model.json, decide the same: the same capacity table, the same summary (request-class pools and step-time
sources included), the same notes and the same step-time and price warnings; the stage adds only its
provenance header (model, trace, code)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.trace import ingest, write_table
from stages import size as stage
from tests.stages._inputs import canonical_trace, first_candidate

SIZE = {
    "slo": {"ttft_ms": 2000, "itl_ms": 100, "attainment_target": 0.95, "warmup_frac": 0.1, "drain_frac": 0.1},
    "search": {"seeds": [0], "rel_tol": 0.1},
    "excerpt_requests": 150,
    "shortlist": 1,
    "pd_prefill_shortlist": 0,
    "count_seeds": [],
    "pools_split_isl": 1000,
}


def test_the_command_and_the_stage_decide_the_same(tmp_path: Path) -> None:
    first_candidate(tmp_path, {"trace": {"file": "trace.parquet"}, "size": SIZE})
    write_table(canonical_trace(400, 0.1), tmp_path / "raw.parquet")
    write_table(ingest(tmp_path / "raw.parquet").trace, tmp_path / "trace.parquet")  # as the clean stage writes it
    (tmp_path / "step_model.json").write_text(json.dumps({"source": "roofline-fallback"}))
    inputs = {
        "--params": "params.yaml",
        "--trace": "trace.parquet",
        "--candidates": "candidates.parquet",
        "--step-model": "step_model.json",
    }
    argv = [a for k, v in inputs.items() for a in (k, str(tmp_path / v))]
    assert (
        stage.main(
            [
                *argv,
                "--capacity",
                str(tmp_path / "stage.parquet"),
                "--report-dir",
                str(tmp_path / "stage"),
                "--metrics",
                str(tmp_path / "metrics.json"),
                "--plot-data",
                str(tmp_path / "plot.csv"),
            ]
        )
        == 0
    )
    r = CliRunner().invoke(app, ["size", *argv, "--out", str(tmp_path / "cli"), "--json"])
    assert r.exit_code == 0, r.output

    assert pq.read_table(tmp_path / "cli" / "capacity.parquet").equals(pq.read_table(tmp_path / "stage.parquet"))
    by_stage = json.loads((tmp_path / "stage" / "summary.json").read_text())
    by_cli = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert "pools" in by_stage and by_stage["step_model_source"] == "roofline-fallback"
    assert {
        k: by_cli[k] for k in by_stage
    } == by_stage  # the command adds its own fields (serve commands, input accounting)
    notes = lambda d: (d / "capacity.md").read_text().split("## Notes", 1)[1]  # noqa: E731
    assert "request-class pools" in notes(tmp_path / "stage") and notes(tmp_path / "cli") == notes(tmp_path / "stage")
    # the same loud warnings (roofline step times, assumed prices) whichever wrote the report
    warnings = lambda d: [
        ln
        for ln in (d / "capacity.md").read_text().splitlines()
        if ln.startswith(("- **Step times:**", "- **Prices:**"))
    ]  # noqa: E731
    assert warnings(tmp_path / "cli") == warnings(tmp_path / "stage") and len(warnings(tmp_path / "stage")) == 2
    assert (
        all("⚠" in ln for ln in warnings(tmp_path / "stage"))
        and "ROOFLINE, NOT MEASURED" in warnings(tmp_path / "cli")[0]
    )


def test_params_and_the_options_it_replaces_are_not_given_together(tmp_path: Path) -> None:
    first_candidate(tmp_path, {"size": SIZE})
    write_table(canonical_trace(40, 0.1), tmp_path / "trace.parquet")
    r = CliRunner().invoke(
        app,
        [
            "size",
            "--trace",
            str(tmp_path / "trace.parquet"),
            "--params",
            str(tmp_path / "params.yaml"),
            "--slo-ttft-p99",
            "500",
        ],
    )
    assert r.exit_code == 2 and "drop --slo-ttft-p99 or --params" in r.output, r.output
