"""Stage `replay` in process against a real digital twin (`llmcap twin serve` as a child process): the
plan's unit replayed at 0.8x / 1.0x / 1.2x, every request a row, the prediction beside it, the twin
named as such everywhere, and the twin process gone afterwards."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmcap.replaycheck.runs import RECORD_SCHEMA
from llmcap.sizing.units import candidate_key
from llmcap.trace import write_table
from stages import replay as stage
from tests.stages._inputs import MODEL, canonical_trace, first_candidate

RATE = 4.0  # req/s: the plan's per-instance rate G for this unit, where the check's knee search starts
pytestmark = pytest.mark.timing  # the sends are checked against their schedule in wall time
REQUESTS, DILATION = 12, 0.25


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    tmp = tmp_path_factory.mktemp("replay")
    row = first_candidate(
        tmp,
        {
            "replay": {
                "excerpt_requests": REQUESTS,
                "twin_dilation": DILATION,
                "isl_buckets": [1024],
                "osl_buckets": [32],
            }
        },
    )
    summary = {
        "chosen": candidate_key(row),
        "mode": "aggregated",
        "pool_plans": {"instances": {"per_instance_rps": RATE}},
    }
    (tmp / "summary.json").write_text(json.dumps(summary))
    (tmp / "step_model.json").write_text(json.dumps({"source": "roofline-fallback"}))
    write_table(canonical_trace(200, 0.5), tmp / "trace.parquet")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = stage.main(
            [
                "--params",
                str(tmp / "params.yaml"),
                "--trace",
                str(tmp / "trace.parquet"),
                "--candidates",
                str(tmp / "candidates.parquet"),
                "--capacity-summary",
                str(tmp / "summary.json"),
                "--step-model",
                str(tmp / "step_model.json"),
                "--measured",
                str(tmp / "out/measured.parquet"),
                "--predicted",
                str(tmp / "out/predicted.parquet"),
                "--report-dir",
                str(tmp / "report"),
            ]
        )
    assert code == 0, err.getvalue()[-3000:]
    return tmp, out.getvalue(), err.getvalue()


def test_every_request_is_a_row_measured_and_predicted(replayed: tuple[Path, str, str]) -> None:
    tmp, _, _ = replayed
    measured = pq.read_table(tmp / "out/measured.parquet")
    predicted = pq.read_table(tmp / "out/predicted.parquet")
    assert measured.schema.equals(RECORD_SCHEMA) and predicted.schema.equals(RECORD_SCHEMA)
    assert measured.num_rows == predicted.num_rows == 3 * REQUESTS
    key = lambda t: list(
        zip(
            t.column("run").to_pylist(),
            t.column("excerpt_seed").to_pylist(),
            t.column("request_id").to_pylist(),
            strict=True,
        )
    )  # noqa: E731
    assert key(measured) == key(predicted)
    assert sorted(set(measured.column("run").to_pylist())) == ["0.8x", "1.2x", "1x"]
    assert set(measured.column("status").to_pylist()) <= {"ok", "unfinished", "rejected"}
    assert measured.column("isl").to_pylist() == predicted.column("isl").to_pylist()

    # measured times are on the simulated clock: the sends left at the predicted arrivals, late only by the
    # client's lateness (wall ms, x 1/dilation); a twin TTFT is the simulated one plus HTTP time, never 4x off
    late = _minus(measured, predicted, "arrival_s")
    assert (late >= -1e-6).all() and (late <= 0.05 / DILATION).all(), late
    ok = np.array(measured.column("status").to_pylist()) == "ok"
    ratio = np.array(measured.column("ttft_s").to_pylist(), dtype=float) / np.array(
        predicted.column("ttft_s").to_pylist(), dtype=float
    )
    run = np.array(measured.column("run").to_pylist())
    for label in ("0.8x", "1x", "1.2x"):  # per run: a later run must not find its prompts cached by an earlier one
        assert 0.5 < float(np.median(ratio[ok & (run == label)])) < 4.0, (label, ratio)


def _minus(a: pa.Table, b: pa.Table, column: str) -> np.ndarray:
    return np.asarray(a.column(column).to_pylist(), dtype=float) - np.asarray(b.column(column).to_pylist(), dtype=float)


def test_the_summary_names_the_twin_and_holds_the_comparison(replayed: tuple[Path, str, str]) -> None:
    tmp, out, err = replayed
    s = json.loads((tmp / "report/summary.json").read_text())
    assert s["source"] == "digital-twin" and "NOT from a real engine" in s["warning"]
    assert s["twin_command"][:3] == ["llmcap", "twin", "serve"] and MODEL in s["twin_command"]
    assert "DIGITAL TWIN (not a measurement)" in out and "DIGITAL TWIN" in err
    assert "NOT from a real engine" in (tmp / "report/replay.md").read_text()
    assert "NOT from a real engine" in (tmp / "report/replay.html").read_text()
    # no deployment record: a round-robin share; the unit's rate (4 req/s) is above the trace's (2 req/s), so
    # each run is every request of its window, closer together; the runs bracket the predicted knee
    assert s["requests_sent"] == 3 * REQUESTS and s["load"] == s["knee"]["load"] >= 1.0 and s["knee"]["held"]
    assert all("every request" in r["traffic"] for r in s["runs"])
    assert [r["rate_rps"] for r in s["runs"]] == pytest.approx(
        [0.8 * s["rate_rps"], s["rate_rps"], 1.2 * s["rate_rps"]]
    )
    # the bucket table counts every ok request once per side
    ok_measured = sum(r["measured"]["status"]["ok"] for r in s["runs"])
    assert sum(b["n_measured"] for b in s["buckets"]) == ok_measured
    assert sum(b["n_predicted"] for b in s["buckets"]) == sum(r["predicted"]["status"]["ok"] for r in s["runs"])
    assert {b["isl_bucket"] for b in s["buckets"]} <= {"<1024", ">=1024"} and {
        b["osl_bucket"] for b in s["buckets"]
    } <= {"<32", ">=32"}
    for side in ("measured", "predicted"):
        v = s["verdict"][side]
        assert v["band"] == [0.8, 1.2] and set(v["holds"]) == {"0.8x", "1x", "1.2x"}
        assert v["knee_in_band"] == (v["holds_at_low"] and v["fails_at_high"] and not v["invalid_runs"])
    # the simulator at 0.8x of its own knee meets the SLOs
    low = next(r["predicted"] for r in s["runs"] if r["run"] == "0.8x")
    assert low["attainment"] == 1.0 and 0 < low["judged"] == low["met"] < 381
    # every judged request met the SLOs, but fewer than 381 cannot show 99% at 95% confidence: inconclusive, not a verdict
    assert (
        s["verdict"]["predicted"]["judgement"]["0.8x"] == "inconclusive"
        and s["verdict"]["predicted"]["holds_at_low"] is False
    )
    checks = json.loads((tmp / "report/validation.json").read_text())
    assert [c["suite"] for c in checks] == ["replay_measured", "replay_predicted"] and all(c["success"] for c in checks)


def test_the_twin_process_is_gone(replayed: tuple[Path, str, str]) -> None:
    twins = [p for p in psutil.Process().children(recursive=True) if "twin" in " ".join(p.cmdline())]
    assert twins == []
