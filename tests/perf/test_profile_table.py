"""Profile tables: schema, storage round trip, monotone log-space interpolation, flagged extrapolation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmcap.errors import InputFileError
from llmcap.perf import (
    POINTS_SCHEMA,
    EnvironmentFingerprint,
    LinearStepModel,
    Profile,
    StepBatch,
    interpolate,
    read_profile,
)
from llmcap.perf.calibrate import StepObservations, decode_observations, fit_step_model, prefill_observations
from llmcap.perf.profile import points_table, steps_table

ISL = [128, 512, 2048, 8192]
CONC = [1, 4, 16]


def _power_law_points() -> pa.Table:
    """ttft = 1e-3 · isl^1.2 · c^0.5: a power law, so log-log interpolation must be exact."""
    rows = [
        {
            "source": "endpoint",
            "isl": i,
            "osl": 64,
            "concurrency": c,
            "batch_size": c,
            "cache_hit": 0.0,
            "tp": 1,
            "pp": 1,
            "ep": 1,
            "dp": 1,
            "repeats": 3,
            "requests": 3 * c,
            "steady_gaps": 0,
            "ttft_s": 1e-3 * i**1.2 * c**0.5,
        }
        for i in ISL
        for c in CONC
    ]
    return points_table(rows)


def test_points_table_has_the_documented_schema() -> None:
    t = _power_law_points()
    assert t.schema.equals(POINTS_SCHEMA)
    assert t.num_rows == len(ISL) * len(CONC)
    assert t.column("itl_mean_s").null_count == t.num_rows  # not given: null, not 0


def test_interpolation_is_exact_on_a_power_law_and_flags_nothing_inside() -> None:
    t = _power_law_points()
    isl = np.array([128, 300, 1000, 5000, 8192])
    for c in (1, 2, 4, 10, 16):
        got = interpolate(t, "ttft_s", isl, c)
        assert got.value == pytest.approx(1e-3 * isl**1.2 * c**0.5, rel=1e-9)
        assert not got.any_extrapolated


def test_extrapolation_is_flagged_per_query_and_follows_the_end_slope() -> None:
    t = _power_law_points()
    got = interpolate(t, "ttft_s", [64, 1000, 16384, 1000], [1, 1, 1, 32])
    assert got.extrapolated.tolist() == [True, False, True, True]
    # log-log end segments of a power law extend it exactly
    expect = 1e-3 * np.array([64, 1000, 16384, 1000]) ** 1.2 * np.array([1, 1, 1, 32]) ** 0.5
    assert got.value == pytest.approx(expect, rel=1e-9)


def test_noisy_measurements_are_made_monotone() -> None:
    rows = [{"isl": i, "concurrency": 1, "ttft_s": v} for i, v in zip(ISL, [0.010, 0.009, 0.030, 0.100], strict=True)]
    t = pa.Table.from_pylist(rows)
    q = np.geomspace(128, 8192, 50)
    got = interpolate(t, "ttft_s", q, 1).value
    assert np.all(np.diff(got) >= 0)  # a longer prompt never prefills faster
    assert got[0] == pytest.approx(0.010) and got[-1] == pytest.approx(0.100)


def test_a_single_level_interpolates_along_isl_and_flags_other_concurrency() -> None:
    rows = [{"isl": i, "concurrency": 4, "itl_mean_s": 0.002 + 1e-7 * i} for i in ISL]
    got = interpolate(pa.Table.from_pylist(rows), "itl_mean_s", [1000, 1000], [4, 8])
    assert got.extrapolated.tolist() == [False, True]
    with pytest.raises(ValueError, match="no measured ttft_s"):
        interpolate(pa.Table.from_pylist([{"isl": 1, "concurrency": 1, "ttft_s": None}]), "ttft_s", 5)


def _profile() -> Profile:
    truth = LinearStepModel(overhead_s=2e-3, per_prefill_token_s=1e-5, per_decode_seq_s=1e-4, per_context_token_s=5e-8)
    isl = np.array(ISL, dtype=float)
    obs = StepObservations.concat(
        [
            prefill_observations(isl, 0.004 + truth.step_time(StepBatch.build(isl))),
            decode_observations([1, 4, 16], [600.0, 600.0, 600.0], [0.0021, 0.0024, 0.0035]),
        ]
    )
    fit = fit_step_model(obs)
    steps = steps_table(obs, ["prefill"] * 4 + ["decode"] * 3, ISL + [568] * 3, [1] * 4 + [1, 4, 16], 3)
    fp = EnvironmentFingerprint(engine="vllm", engine_version="0.32.0", model_id="tiny", device_sku="cpu")
    return Profile(fp, _power_law_points(), steps, fit, {"source": "test"})


def test_profile_round_trips_through_its_directory(tmp_path: Path) -> None:
    prof = _profile()
    prof.write(tmp_path / "p")
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [
        "fingerprint.json",
        "fit.json",
        "manifest.json",
        "points.parquet",
        "steps.parquet",
    ]
    again = read_profile(tmp_path / "p")
    assert again.fingerprint == prof.fingerprint and again.fingerprint_hash == prof.fingerprint_hash
    assert again.points.equals(prof.points) and again.steps.equals(prof.steps)
    assert again.fit == prof.fit
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["fingerprint_hash"] == prof.fingerprint_hash and manifest["format"] == 1
    meta = pq.read_schema(tmp_path / "p" / "points.parquet").metadata
    assert meta[b"llmcap.fingerprint_hash"] == prof.fingerprint_hash.encode()
    assert again.interpolate("ttft_s", 1000, 2).value == pytest.approx(1e-3 * 1000**1.2 * 2**0.5)


def test_a_broken_profile_directory_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="no stored profile fingerprint"):
        read_profile(tmp_path)
    _profile().write(tmp_path / "p")
    (tmp_path / "p" / "points.parquet").unlink()
    with pytest.raises(InputFileError, match="incomplete profile"):
        read_profile(tmp_path / "p")


def test_profile_step_model_reads_decode_steps_from_the_table_and_adds_fitted_prefill() -> None:
    from llmcap.perf import decode_step_time
    from llmcap.perf.profile import ProfileStepModel

    # concave in the batch, as measured on the CPU engine: no single line fits c = 1, 4, 16
    step = lambda c, ctx: 2e-3 * c**0.3 * (1 + ctx / 20_000)  # noqa: E731
    rows = [
        {"isl": 0, "concurrency": c, "decode_context_mean": ctx, "itl_mean_s": step(c, ctx)}
        for c in (1, 4, 16)
        for ctx in (100.0, 1000.0, 3000.0)
    ]
    fit = _profile().fit
    model = ProfileStepModel(pa.Table.from_pylist(rows), fit)
    got = decode_step_time(model, [1, 4, 16, 2, 8], [1000.0, 100.0, 3000.0, 500.0, 2000.0])
    assert got[:3] == pytest.approx([step(1, 1000), step(4, 100), step(16, 3000)], rel=1e-9)
    # between levels: linear in log c, i.e. exact for a power law in c
    assert got[3:] == pytest.approx([step(2, 500), step(8, 2000)], rel=0.02)
    assert not model.last_extrapolated.any()
    decode_step_time(model, [32], [1000.0])
    assert model.last_extrapolated.tolist() == [True]
    # a mixed step: the table's decode step + the fit's marginal prefill cost; a pure prefill: the fit
    mixed = StepBatch.build(prefill_tokens=[512.0, 512.0], decode_seqs=[4.0, 0.0], decode_context=[400.0, 0.0])
    t = model.step_time(mixed)
    lin = fit.model
    assert t[0] == pytest.approx(
        step(4, 100) + lin.per_prefill_token_s * 512 + lin.per_pair_s * 512 * 513 / 2 + lin.per_prefill_seq_s
    )
    assert t[1] == pytest.approx(lin.step_time(mixed)[1])
