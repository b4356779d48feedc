"""Stage `profile` in process: reuse a stored profile whose fingerprint matches, else mark it stale and
fall back to the roofline model loudly (no endpoint in the params); MLflow tags carry the fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from llmcap.config import load_params
from llmcap.live.target import target_fingerprint
from llmcap.perf import Profile
from llmcap.perf.calibrate import StepObservations, decode_observations, fit_step_model, prefill_observations
from llmcap.perf.calibration import shipped_calibrations
from llmcap.perf.profile import points_table, steps_table
from stages import profile as stage
from tests.conftest import ROOT

CATALOG = ROOT / "llmcap" / "catalog" / "data"
TARGET = {"engine_version": "0.32.0", "gpu": "h100", "tp": 2, "block_size": 16}


def _setup(tmp_path: Path, profile_params: dict) -> list[str]:
    params = {"trace": {"file": "unused.jsonl"}, "enumerate": {"model": "Llama-3.1-8B"}, "profile": profile_params}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return [
        "--params",
        str(tmp_path / "params.yaml"),
        "--catalog-dir",
        str(CATALOG),
        "--profile",
        str(tmp_path / "stored"),
        "--step-model",
        str(tmp_path / "out" / "step_model.json"),
        "--report-dir",
        str(tmp_path / "reports"),
    ]


def _store(tmp_path: Path, manifest: dict | None = None, **fingerprint_changes) -> Profile:
    params = load_params(tmp_path / "params.yaml")
    fp = target_fingerprint(params.profile, "Llama-3.1-8B", CATALOG).model_copy(update=fingerprint_changes)
    isl = np.array([128.0, 512.0, 2048.0])
    obs = StepObservations.concat(
        [
            prefill_observations(isl, [0.012, 0.020, 0.061]),
            decode_observations([1, 4, 16], [400.0, 400.0, 1200.0], [0.0071, 0.0074, 0.0093]),
        ]
    )
    rows = [
        {
            "source": "endpoint",
            "isl": int(i),
            "osl": 64,
            "concurrency": 1,
            "batch_size": 1,
            "cache_hit": 0.0,
            "tp": 2,
            "pp": 1,
            "ep": 1,
            "dp": 1,
            "repeats": 3,
            "requests": 3,
            "steady_gaps": 100,
            "ttft_s": t,
            "itl_mean_s": 0.0071,
            "itl_p50_s": 0.007,
            "itl_p99_s": 0.009,
        }
        for i, t in zip(isl, [0.012, 0.020, 0.061], strict=True)
    ]
    prof = Profile(
        fp,
        points_table(rows),
        steps_table(obs, ["prefill"] * 3 + ["decode"] * 3, [128, 512, 2048, 400, 400, 1200], [1, 1, 1, 1, 4, 16], 3),
        fit_step_model(obs),
        {"source": "test", **(manifest or {})},
    )
    prof.write(tmp_path / "stored")
    return prof


def _step_model(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "step_model.json").read_text())


def test_without_a_stored_profile_it_falls_back_to_the_roofline_loudly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stage.main(_setup(tmp_path, TARGET)) == 0
    out, err = capsys.readouterr()
    assert "FALLING BACK TO THE ROOFLINE MODEL" in err and "no stored profile" in err
    assert "step model from ROOFLINE-FALLBACK" in out
    sm = _step_model(tmp_path)
    assert sm["source"] == "roofline-fallback" and sm["stale"] is True
    assert sm["step_model"]["kind"] == "roofline" and sm["step_model"]["tp"] == 2
    assert sm["fingerprint"]["device_sku"] == "H100-SXM-80GB" and sm["fingerprint"]["model_id"] == "Llama-3.1-8B"


def test_a_matching_stored_profile_is_reused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import mlflow

    args = _setup(tmp_path, TARGET)
    prof = _store(tmp_path)
    assert stage.main(args) == 0
    assert "FALLING BACK" not in capsys.readouterr().err
    sm = _step_model(tmp_path)
    assert (sm["source"], sm["stale"], sm["stale_fields"]) == ("profile", False, [])
    assert sm["fingerprint_hash"] == sm["stored_fingerprint_hash"] == prof.fingerprint_hash
    assert sm["step_model"] == json.loads(json.dumps(prof.fit.to_dict()))
    assert json.loads((tmp_path / "reports" / "validation.json").read_text())["success"] is True

    run = mlflow.search_runs(
        experiment_names=["llmcap"],
        filter_string="tags.`dvc.stage` = 'profile'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    ).iloc[0]
    assert run["tags.source"] == "profile" and run["tags.stale"] == "false"
    assert run["tags.fingerprint.hash"] == prof.fingerprint_hash
    assert run["tags.fingerprint.engine_version"] == "0.32.0" and run["tags.fingerprint.tp"] == "2"
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run["run_id"], "profile/table")}
    assert {"profile/table/fit.json", "profile/table/fingerprint.json", "profile/table/points.parquet"} <= artifacts
    # the shipped roofline calibrations (fitted efficiencies with their sources) travel with the run
    logged = {
        a.path
        for a in mlflow.MlflowClient().list_artifacts(run["run_id"], "profile/roofline_calibration/H100-SXM-80GB")
    }
    assert logged == {"profile/roofline_calibration/H100-SXM-80GB/roofline.yaml"}
    assert run["tags.roofline.calibrations"].count("@") == len(shipped_calibrations()) >= 5


def test_the_kv_capacity_the_profiled_engine_stated_reaches_the_size_stage(tmp_path: Path) -> None:
    from llmcap.planning import StepTimes

    args = _setup(tmp_path, TARGET)
    _store(tmp_path, manifest={"kv_capacity_tokens": 123_456})
    assert stage.main(args) == 0
    assert _step_model(tmp_path)["kv_capacity_tokens"] == 123_456
    # the size stage reads it as the engine's KV for the profiled configuration (Llama-3.1-8B on H100 TP2, bf16)
    (kv,) = StepTimes.read(tmp_path / "out" / "step_model.json").engine_kv
    assert kv.tokens == 123_456
    assert dict(kv.match) == {
        "gpu": "H100-SXM-80GB",
        "tp": 2,
        "pp": 1,
        "ep": 1,
        "weight_quant": "bf16",
        "kv_dtype": "bf16",
    }


def test_a_new_engine_version_marks_the_stored_profile_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _setup(tmp_path, {**TARGET, "engine_version": "0.33.0"})
    _store(tmp_path, engine_version="0.32.0")
    assert stage.main(args) == 0
    out, err = capsys.readouterr()
    assert "stored profile is STALE: engine_version: '0.32.0' -> '0.33.0'" in err
    assert "[stale (1 fields differ)]" in out
    sm = _step_model(tmp_path)
    assert sm["source"] == "roofline-fallback" and sm["stale"] is True
    assert sm["stale_fields"] == [{"field": "engine_version", "stored": "0.32.0", "current": "0.33.0"}]
