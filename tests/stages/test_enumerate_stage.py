"""Stage `enumerate` in process: params + workload summary in → candidates parquet, summary, GX record, MLflow run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from stages import enumerate as stage
from stages import validation
from tests.conftest import ROOT

CATALOG = ROOT / "llmcap" / "catalog" / "data"
WORKLOAD = {  # the shape of the characterise stage's summary (only what enumerate reads)
    "rows": 100,
    "isl": {"mean": 3000.2, "p50": 2000.0, "p90": 7000.0, "p99": 15000.5, "min": 10.0, "max": 30000.0},
    "osl": {"mean": 300.0, "p50": 250.0, "p90": 600.0, "p99": 1100.0, "min": 1.0, "max": 2000.0},
}


def _setup(tmp_path: Path, enumerate_params: dict) -> list[str]:
    params = {"trace": {"file": "unused.jsonl"}, "enumerate": enumerate_params}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "workload.json").write_text(json.dumps(WORKLOAD))
    return [
        "--params",
        str(tmp_path / "params.yaml"),
        "--catalog-dir",
        str(CATALOG),
        "--workload",
        str(tmp_path / "workload.json"),
        "--candidates",
        str(tmp_path / "out" / "candidates.parquet"),
        "--report-dir",
        str(tmp_path / "reports"),
    ]


ACCEPTANCE = {  # Llama-3.1-70B bf16 on one 8x H100 node, 8k-token requests
    "model": "Llama-3.1-70B",
    "gpus": ["h100"],
    "weight_quants": ["bf16"],
    "kv_dtypes": ["bf16"],
    "parallel": {"tp": [1, 2, 4, 8]},
    "modes": ["aggregated"],
    "max_context_len": 8192,
}


def test_writes_the_candidates_summary_and_validation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert stage.main(_setup(tmp_path, ACCEPTANCE)) == 0
    assert "[enumerate] Llama-3.1-70B: 4 candidates, 3 feasible" in capsys.readouterr().out

    t = pd.read_parquet(tmp_path / "out" / "candidates.parquet")
    assert list(t["tp"]) == [1, 2, 4, 8]
    assert list(t["feasible"]) == [False, True, True, True]
    assert list(t["reason_codes"]) == ["weights_do_not_fit", "", "", ""]
    assert (t.loc[1:, "kv_tokens_per_instance"] > 0).all()
    assert t.loc[0, "reasons"].startswith("weights 131.4 GiB/rank > usable 71.7 GiB")
    # the workload's ISL + OSL statistics size the concurrency columns (rounded up to whole tokens)
    for label in ("mean", "p50", "p90", "p99", "max"):
        assert f"max_seqs_{label}" in t.columns
    tp8 = t.iloc[3]
    assert tp8["max_seqs_p99"] == tp8["kv_tokens_per_instance"] // (16 * -(-16101 // 16))
    assert pq.read_schema(tmp_path / "out" / "candidates.parquet").metadata[b"llmcap.model"] == b"Llama-3.1-70B"

    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert (summary["rows"], summary["feasible"], summary["infeasible"]) == (4, 3, 1)
    assert summary["infeasible_by_reason"] == {"weights_do_not_fit": 1}
    assert summary["context_lengths"] == {"mean": 3301, "p50": 2250, "p90": 7600, "p99": 16101, "max": 32000}
    assert summary["max_context_len"] == 8192

    record = json.loads((tmp_path / "reports" / "validation.json").read_text())
    assert record["suite"] == "candidates" and record["success"] is True
    assert len(record["results"]) > 10


def test_is_deterministic_and_logs_to_mlflow(tmp_path: Path) -> None:
    import mlflow

    args = _setup(tmp_path, {"gpus": ["h100", "h200"], "parallel": {"tp": [2, 4]}})  # max context: workload
    assert stage.main(args) == 0
    first = [
        (tmp_path / p).read_bytes()
        for p in ("out/candidates.parquet", "reports/summary.json", "reports/validation.json")
    ]
    assert stage.main(args) == 0
    again = [
        (tmp_path / p).read_bytes()
        for p in ("out/candidates.parquet", "reports/summary.json", "reports/validation.json")
    ]
    assert first == again

    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert summary["max_context_len"] == 32000  # longest ISL + longest OSL of the workload
    assert summary["rows"] == 3 * 2 * 2  # roles (aggregated; disaggregated prefill, decode) x GPUs x TP

    runs = mlflow.search_runs(
        experiment_names=["llmcap"],
        filter_string="tags.`dvc.stage` = 'enumerate'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    run = runs.iloc[0]
    assert run["metrics.candidates"] == 12 and run["metrics.feasible"] == summary["feasible"]
    assert run["tags.model"] == "Llama-3.1-70B" and run["tags.validation.success"] == "true"
    for tag in (
        "tags.git.commit",
        "tags.dvc.stage_hash",
        "tags.input.workload.sha256",
        "tags.input.model_config.sha256",
    ):
        assert run[tag], tag
    assert json.loads(run["params.enumerate.gpus"]) == ["h100", "h200"]


def test_bad_params_are_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert stage.main(_setup(tmp_path, {"gpus": ["v100"]})) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "field 'enumerate.gpus.0': unknown GPU 'v100'" in err[0]

    assert stage.main(_setup(tmp_path, {"modle": "Llama-3.1-8B"})) == 2
    assert "field 'enumerate.modle'" in capsys.readouterr().err


def test_a_broken_table_fails_the_suite_readably(tmp_path: Path) -> None:
    assert stage.main(_setup(tmp_path, ACCEPTANCE)) == 0
    good = pd.read_parquet(tmp_path / "out" / "candidates.parquet")
    assert validation.validate(good, "candidates", validation.candidates_suite).success

    broken = good.copy()
    broken.loc[0, "reasons"] = ""  # an infeasible row without a reason
    broken.loc[1, "tp"] = 0  # an impossible degree
    broken.loc[2, "kv_tokens_per_rank"] = -16  # a feasible row without KV
    record = validation.validate(broken, "candidates", validation.candidates_suite)
    assert not record.success
    failed = {(r["expectation"], r["kwargs"]["column"]) for r in record.failures()}
    assert failed == {
        ("expect_column_value_lengths_to_be_between", "reasons"),
        ("expect_column_values_to_be_between", "tp"),
        ("expect_column_values_to_be_between", "kv_tokens_per_rank"),
    }
    text = record.summary()
    assert text.splitlines()[0].startswith("suite 'candidates': 3 of ")
    assert "column=reasons, row_condition=feasible == False" in text and "e.g. ['']" in text
    assert "column=kv_tokens_per_rank, row_condition=feasible == True" in text and "e.g. ['-16']" in text
    with pytest.raises(validation.ValidationFailed, match="3 of .* expectations failed"):
        validation.require(record)


def test_an_engine_preset_sets_each_gpus_scheduler_knobs_and_the_admission(tmp_path: Path) -> None:
    """`enumerate.engine: trtllm`: every role on every GPU takes TensorRT-LLM's own defaults (llmcap.engine_presets:
    chunk 8192, max batch 2048, KV block 32) instead of the grids; `size` then admits as it does, unless
    size.admission_policy says otherwise, which must then be TensorRT-LLM's or the params fail."""
    from llmcap.config import Params

    grid = ACCEPTANCE | {
        "gpus": ["h100", "h200"],
        "modes": ["aggregated", "disaggregated"],
        "engine": "trtllm",
        "aggregated": {"max_num_seqs": [256], "max_num_batched_tokens": [512, 2048]},
    }
    assert stage.main(_setup(tmp_path, grid)) == 0
    t = pd.read_parquet(tmp_path / "out" / "candidates.parquet")
    assert set(t["gpu"]) == {"H100-SXM-80GB", "H200-SXM-141GB"} and list(t["row"]) == list(range(len(t)))
    assert set(zip(t["max_num_seqs"], t["max_num_batched_tokens"], t["block_size"], strict=True)) == {(2048, 8192, 32)}
    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert {g: p["engine"] for g, p in summary["engine_preset"].items()} == {
        "H100-SXM-80GB": "trtllm",
        "H200-SXM-141GB": "trtllm",
    }

    base = {"trace": {"file": "t.jsonl"}, "enumerate": grid}
    assert Params.model_validate(base).sizing().admission_policy == "trtllm-guaranteed-no-evict"
    assert (
        Params.model_validate(base | {"size": {"admission_policy": "trtllm-max-utilization"}}).sizing().admission_policy
        == "trtllm-max-utilization"
    )
    with pytest.raises(ValueError, match="size.admission_policy 'vllm' contradicts enumerate.engine 'trtllm'"):
        Params.model_validate(base | {"size": {"admission_policy": "vllm"}})
