"""Stage `autoscale` in process: the size summary's chosen deployment on a synthesized day, static vs autoscaled —
report, plot, summary, GX record and MLflow run, all labelled simulated; byte-identical on a rerun; `enabled: false`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmcap.sizing.units import candidate_key
from llmcap.trace import write_table
from stages import autoscale as stage
from tests.stages._inputs import canonical_trace, first_candidate

AUTOSCALE = {
    "period_s": 1800,
    "duration_s": 1800,
    "t_ready_s": 60,
    "min_residency_s": 60,
    "scale_down_window_s": 30,
    "floor_fractions": [0, 1],
    "windows": 6,
}
G, RATE = 6.0, 10.0  # one instance's max feasible rate, the plan's rate (req/s)


def _setup(tmp: Path, autoscale: dict) -> list[str]:
    row = first_candidate(
        tmp, {"autoscale": autoscale, "size": {"slo": {"ttft_ms": 2000, "itl_ms": 100, "attainment_target": 0.99}}}
    )
    pool = {"configuration": candidate_key(row), "per_instance_rps": G, "gpus_per_instance": 1}
    summary = {
        "chosen": candidate_key(row),
        "mode": "aggregated",
        "planning_rps": RATE,
        "router": "least_outstanding_tokens",
        "pool_plans": {"instances": pool},
    }
    (tmp / "summary.json").write_text(json.dumps(summary))
    (tmp / "step_model.json").write_text(json.dumps({"source": "roofline-fallback"}))
    write_table(canonical_trace(400, 0.1), tmp / "trace.parquet")
    return [
        "--params",
        str(tmp / "params.yaml"),
        "--trace",
        str(tmp / "trace.parquet"),
        "--candidates",
        str(tmp / "candidates.parquet"),
        "--step-model",
        str(tmp / "step_model.json"),
        "--capacity-summary",
        str(tmp / "summary.json"),
        "--report-dir",
        str(tmp / "reports"),
    ]


def test_the_chosen_plan_on_a_day_static_vs_autoscaled(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _setup(tmp_path, AUTOSCALE)
    assert stage.main(argv) == 0
    assert "simulated day (not a measurement)" in capsys.readouterr().out
    reports = tmp_path / "reports"
    s = json.loads((reports / "summary.json").read_text())
    assert s["simulated"] is True and s["enabled"] is True
    peak = RATE * 1.6  # the default amplitude 0.6
    assert s["pools"]["both"]["static_instances"] == int(np.ceil(peak / G))
    assert [p["plan"] for p in s["plans"]] == ["static", "auto f=0", "auto f=1"]
    static = s["plans"][0]
    assert static["gpu_hours"] == pytest.approx(static["instance_hours"])  # one GPU per instance
    assert s["floor_that_keeps_attainment"] in (None, 0.0, 1.0)
    # t_ready_s 60 overrides the phases' sum 600 and scales them: pod running at 210/600 × 60 = 21 s, model ready at 570/600 × 60 = 57 s
    assert s["scale_up"]["after_ask_s"] == {
        "pod_running": pytest.approx(21.0),
        "model_ready": pytest.approx(57.0),
        "router_admitted": 60,
    }
    assert s["forecast"]["kind"] == "synthetic" and s["forecast"]["note"].startswith(
        "forecast NOT fitted"
    )  # 40 s of trace
    md = (reports / "autoscale.md").read_text()
    assert (
        md.startswith("# Autoscaling what-if (simulated, not a measurement)")
        and "![instances over the day](instances.png)" in md
    )
    assert (reports / "instances.png").stat().st_size > 10_000
    assert json.loads((reports / "validation.json").read_text())["success"] is True
    first = (reports / "summary.json").read_bytes()
    assert stage.main(argv) == 0 and (reports / "summary.json").read_bytes() == first  # deterministic

    import mlflow

    run = mlflow.search_runs(
        experiment_names=["llmcap"],
        filter_string="tags.`dvc.stage` = 'autoscale'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    ).iloc[0]
    assert run["tags.simulated"] == "true" and run["metrics.gpu_hours.static"] == pytest.approx(static["gpu_hours"])
    assert run["metrics.attainment.floor_1"] == pytest.approx(s["plans"][2]["attainment"])


def test_disabled_says_so(tmp_path: Path) -> None:
    argv = _setup(tmp_path, AUTOSCALE | {"enabled": False})
    assert stage.main(argv) == 0
    assert json.loads((tmp_path / "reports" / "summary.json").read_text()) == {"enabled": False}
    assert "Not run" in (tmp_path / "reports" / "autoscale.md").read_text()
