"""A profile written by `llmcap profile` times `simulate` and `size` from the command line, for the
configuration it was measured on (the same keying the pipeline's size stage uses)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.errors import LlmcapError
from llmcap.perf import CalibratedFit, EnvironmentFingerprint, LinearStepModel
from llmcap.sizing.measured import config_key, load_profile, measured_models
from tests._size_cli import size_args
from tests.conftest import TRACES
from tests.perf.test_profile_table import _profile

runner = CliRunner()
# ten times slower than the roofline's Llama-3.1-8B on one H100: a profile that is used shows in every figure
SLOW = LinearStepModel(overhead_s=0.05, per_prefill_token_s=2e-4, per_decode_seq_s=1e-3)
H100 = {"device_sku": "h100", "tp": 1, "quantization": "bf16", "kv_dtype": "bf16"}


def _write(tmp_path: Path, name: str, **fingerprint) -> Path:
    fit = CalibratedFit(SLOW, 0.0, ("overhead_s", "per_prefill_token_s", "per_decode_seq_s"), 10, 0.01, 0.02)
    prof = replace(
        _profile(),
        fingerprint=EnvironmentFingerprint(engine="vllm", engine_version="0.32.0", model_id="m", **fingerprint),
        fit=fit,
    )
    return prof.write(tmp_path / name)


def _trace(tmp_path: Path, rows: int) -> Path:
    path = tmp_path / "azure_head.csv"
    path.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[: rows + 1]) + "\n")
    return path


def _rows(*variants: dict) -> pd.DataFrame:
    """Candidate rows: one H100 TP1 bf16 row changed by each variant."""
    base = {"gpu": "H100-SXM-80GB", "tp": 1, "pp": 1, "ep": 1, "weight_quant": "bf16", "kv_dtype": "bf16"}
    return pd.DataFrame([base | v for v in variants])


def test_the_fingerprint_keys_the_candidates_it_was_measured_on(tmp_path):
    prof = load_profile(_write(tmp_path, "p", **H100))
    rows = _rows({}, {"tp": 2}, {"gpu": "H200-SXM-141GB"})
    assert list(prof.models_for(rows)) == [config_key(rows.iloc[0])]  # "h100" is the catalog's H100-SXM-80GB
    assert all(m is prof.fit.model for m in prof.models_for(rows).values())
    # the stage keys step_model.json's fingerprint the same way
    assert measured_models(prof.fit, prof.fingerprint) == prof.models_for(rows)
    # a field the profile leaves unstated matches only where the search has one value for it
    vague = load_profile(_write(tmp_path, "vague", device_sku="h100", tp=1, kv_dtype="bf16"))
    assert list(vague.models_for(rows)) == [config_key(rows.iloc[0])]
    with pytest.raises(
        LlmcapError, match=r"does not state its weight_quant; this search considers bf16, fp8: give --weight-quant"
    ):
        vague.models_for(_rows({}, {"weight_quant": "fp8"}))
    with pytest.raises(LlmcapError, match="matches no feasible candidate of this search"):
        prof.models_for(_rows({"tp": 2}))
    assert measured_models(vague.fit, vague.fingerprint) == {}  # the pipeline needs every field stated


def test_a_directory_that_is_not_a_profile_is_one_clear_error(tmp_path):
    r = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(_trace(tmp_path, 50)),
            "--model",
            "Llama-3.1-8B",
            "--gpu",
            "h100",
            "--profile",
            str(tmp_path / "nowhere"),
        ],
    )
    assert r.exit_code == 2 and "fingerprint.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_simulate_times_steps_with_the_profile(tmp_path):
    trace = _trace(tmp_path, 200)
    base = [
        "simulate",
        "--trace",
        str(trace),
        "--model",
        "Llama-3.1-8B",
        "--gpu",
        "h100",
        "--rate-scale",
        "0.2",
        "--json",
    ]
    roofline = json.loads(runner.invoke(app, base).stdout)
    r = runner.invoke(app, [*base, "--profile", str(_write(tmp_path, "p", **H100))])
    assert r.exit_code == 0, r.output
    measured = json.loads(r.stdout)
    assert measured["step_model"] == "LinearStepModel" and roofline["step_model"] != "LinearStepModel"
    assert measured["profile"]["fingerprint_hash"] == load_profile(tmp_path / "p").fingerprint_hash
    assert (
        measured["ttft_ms"]["p50"] > 5 * roofline["ttft_ms"]["p50"]
        and measured["itl_ms"]["p50"] > 5 * roofline["itl_ms"]["p50"]
    )
    # measured on another GPU or layout: refused, naming what differs; a CPU engine's profile is allowed
    other = runner.invoke(
        app, [*base, "--profile", str(_write(tmp_path, "h200", **(H100 | {"device_sku": "h200", "tp": 2})))]
    )
    assert other.exit_code == 2 and "--gpu H100-SXM-80GB (profile: H200-SXM-141GB); --tp 1 (profile: 2)" in other.stderr
    cpu = runner.invoke(app, [*base, "--profile", str(_write(tmp_path, "cpu", **(H100 | {"device_sku": "cpu:Xeon"})))])
    assert cpu.exit_code == 0 and json.loads(cpu.stdout)["ttft_ms"] == measured["ttft_ms"]


def test_size_times_the_matching_candidate_with_the_profile(tmp_path):
    trace = _trace(tmp_path, 1500)
    base = size_args(
        trace=trace,
        quant="bf16",
        excerpt=200,
        slos=("--goodput", "ttft:2000", "--goodput", "itl:100", "--attainment", "0.95"),
    )
    roofline = json.loads(runner.invoke(app, base).stdout)
    r = runner.invoke(app, [*base, "--profile", str(_write(tmp_path, "p", **H100)), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    import pyarrow.parquet as pq

    assert set(pq.read_table(tmp_path / "out" / "capacity.parquet").column("step_model").to_pylist()) == {
        "measured profile"
    }
    assert roofline["step_model"] == {"source": "roofline", "line": "the roofline for every candidate"}
    assert s["step_model"]["source"] == "profile" and s["step_model"]["configurations"] == [
        "H100-SXM-80GB TP1 PP1 EP1, weights bf16, KV bf16"
    ]
    # the slow measured steps carry far less per instance than the roofline's
    assert 0 < s["max_rps_per_unit"] < 0.5 * roofline["max_rps_per_unit"]
