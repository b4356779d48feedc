"""Stage `reconcile` in process, on replay-shaped files made here (measured / predicted request records
with `run` and `excerpt_seed`): decisions and corrections JSON, Markdown report, GX record, MLflow run;
a bad params section fails with its field named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from stages import reconcile as stage
from tests.reconcile._records import pair_of


def _setup(tmp_path: Path, reconcile_params: dict, scale) -> list[str]:
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump({"trace": {"file": "unused.jsonl"}, "reconcile": reconcile_params})
    )
    runs = [pair_of(scale, n=200, seed=s) for s in (0, 1)]  # two excerpts of one run
    for side, k in (("measured", 0), ("predicted", 1)):
        tables = [
            t[k].set_column(
                t[k].schema.get_field_index("excerpt_seed"), "excerpt_seed", pa.array([s] * 200, pa.int64())
            )
            for s, t in enumerate(runs)
        ]
        pq.write_table(pa.concat_tables(tables), tmp_path / f"{side}.parquet")
    return [
        "--params",
        str(tmp_path / "params.yaml"),
        "--measured",
        str(tmp_path / "measured.parquet"),
        "--predicted",
        str(tmp_path / "predicted.parquet"),
        "--out",
        str(tmp_path / "out" / "reconcile.json"),
        "--report-dir",
        str(tmp_path / "reports"),
    ]


def test_writes_decisions_corrections_report_and_validation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _setup(tmp_path, {"isl_edges": [0, 8192], "bootstrap": 200}, lambda isl: np.where(isl > 8192, 1.5, 1.0))
    assert stage.main(argv) == 0
    assert "2 buckets (1 split, 1 within_tolerance); corrections: x1.5 past 8192 tokens" in capsys.readouterr().out
    out = json.loads((tmp_path / "out" / "reconcile.json").read_text())
    rec = out["reconciliation"]
    assert rec["accounting"]["paired_ok"] == 400  # the two excerpts pair by (run, excerpt_seed, request_id)
    assert [b["decision"] for b in rec["buckets"]] == ["within_tolerance", "split"]
    assert rec["corrections"][0]["min_context"] == 8192
    assert "| isl=[8192,inf) osl=[0,inf) run=1.0x | " in (tmp_path / "reports" / "reconcile.md").read_text()
    assert json.loads((tmp_path / "reports" / "validation.json").read_text())["success"] is True
    # same inputs and params: byte-identical output
    first = (tmp_path / "out" / "reconcile.json").read_bytes()
    assert stage.main(argv) == 0 and (tmp_path / "out" / "reconcile.json").read_bytes() == first

    import mlflow

    run = mlflow.search_runs(
        experiment_names=["llmcap"],
        filter_string="tags.`dvc.stage` = 'reconcile'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    ).iloc[0]
    assert run["metrics.buckets.split"] == 1 and run["metrics.requests.paired"] == 400
    assert run["metrics.correction.8192"] == pytest.approx(rec["corrections"][0]["factor"])
    assert run["tags.validation.success"] == "true" and run["tags.input.measured.sha256"]


def test_a_bad_params_value_names_its_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert stage.main(_setup(tmp_path, {"isl_edges": [100, 50]}, lambda isl: np.ones(isl.size))) == 2
    assert "reconcile.isl_edges" in capsys.readouterr().err
