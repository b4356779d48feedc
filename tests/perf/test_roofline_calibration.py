"""The roofline's efficiencies fitted to timed operations (llmcap.perf.calibration) and shipped per GPU."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from llmcap.catalog import get_gpu
from llmcap.cli import app
from llmcap.perf import build_step_model
from llmcap.perf import calibration as cal
from llmcap.perf.efficiency import RooflineParams

H200 = get_gpu("h200")
SHIPPED = cal.CALIBRATION_DIR / H200.name
runner = CliRunner()


@pytest.fixture(scope="module")
def shipped_rows() -> cal.OpRows:
    return cal.load_rows(SHIPPED / "ops.json")[0]


def test_the_fit_recovers_known_knobs_from_the_timed_shapes(shipped_rows):
    truth = cal.RooflineFit({"bf16": (0.62, 90.0), "fp8": (0.55, 140.0)}, 0.58, 1800.0, 0.83)
    rng = np.random.default_rng(0)
    times = cal.predict(shipped_rows, truth, H200) * np.exp(0.01 * rng.standard_normal(len(shipped_rows)))
    rows = cal.OpRows(shipped_rows.op, shipped_rows.dtype, shipped_rows.group, shipped_rows.tokens, shipped_rows.flops,
                      shipped_rows.nbytes, times)
    got = cal.fit(rows, H200)
    np.testing.assert_allclose(got.vector(), truth.vector(), rtol=0.05)


def test_the_shipped_calibration_is_the_fit_of_the_shipped_operations(shipped_rows):
    doc = yaml.safe_load((SHIPPED / "roofline.yaml").read_text())
    assert doc["gpu"] == H200.name and doc["source"]["sha256"] == cal.sha256(SHIPPED / "ops.json")
    assert "H200" in doc["source"]["environment"]["device"]
    refit = cal.fit(shipped_rows, H200)
    np.testing.assert_allclose(cal.shipped_calibration(H200.name).fit.vector(), refit.vector(), rtol=1e-3)


def test_calibrated_knobs_predict_held_out_operations_better_than_the_defaults(shipped_rows):
    cv = cal.cross_validate(shipped_rows, H200)
    by_op = {r["op"]: r for r in cv.rows()}
    assert set(by_op) == {"gemm", "attn_prefill", "attn_decode", "copy", "all", cal.BELOW_SCOPE}
    assert sum(by_op[o]["rows"] for o in ("all", cal.BELOW_SCOPE)) == len(shipped_rows)
    for op in ("all", "gemm", "attn_prefill"):
        assert by_op[op]["held_out"] < by_op[op]["uncalibrated"], (op, by_op[op])
    # each group is predicted by a fit that never saw it: no better than the fit that saw everything
    assert by_op["all"]["held_out"] >= by_op["all"]["calibrated"] - 1e-9
    assert np.isnan(by_op[cal.BELOW_SCOPE]["held_out"])


def test_rooflines_of_a_calibrated_gpu_use_it_and_others_keep_the_defaults():
    h200 = build_step_model("Llama-3.1-8B", "h200")
    shipped = cal.shipped_calibration(H200.name)
    assert h200.calibration == shipped and h200.params == shipped.fit.params("bf16")
    fp8 = build_step_model("Llama-3.1-8B", "h200", weight_quant="fp8")
    assert fp8.compute_dtype == "fp8" and fp8.params.matmul_efficiency_max == shipped.fit.matmul["fp8"][0]
    h100 = build_step_model("Llama-3.1-8B", "h100")
    assert h100.calibration is None and h100.params == RooflineParams()
    explicit = build_step_model("Llama-3.1-8B", "h200", params=RooflineParams())
    assert explicit.calibration is None and explicit.params == RooflineParams()


def test_the_attention_ramp_has_its_own_half_point():
    base = RooflineParams(matmul_half_tokens=32.0)
    own = base.model_copy(update={"attention_half_tokens": 2000.0})
    m_base = build_step_model("Llama-3.1-8B", "h100", params=base)
    m_own = build_step_model("Llama-3.1-8B", "h100", params=own)
    from llmcap.perf import prefill_time
    # a slower attention ramp only lengthens prefill; GEMMs keep their own ramp
    assert prefill_time(m_own, 1024)[0] > prefill_time(m_base, 1024)[0]
    for m in (m_base, m_own):
        np.testing.assert_allclose(prefill_time(m.compile(), 1024), prefill_time(m, 1024), rtol=1e-12)


def test_calibrate_command_prints_the_fit_and_refuses_operations_of_another_gpu():
    r = runner.invoke(app, ["calibrate", str(SHIPPED / "ops.json"), "--gpu", "h200", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["gpu"] == H200.name and set(out["matmul"]) == {"bf16", "fp8"} and "attn_prefill" in out["median_abs_error"]
    r = runner.invoke(app, ["calibrate", str(SHIPPED / "ops.json"), "--gpu", "h100"])
    assert r.exit_code == 2 and "not H100" in r.output


def test_a_file_that_is_not_a_calibration_set_is_one_clear_error(tmp_path):
    bad = tmp_path / "ops.json"
    bad.write_text(json.dumps({"rows": [{"op": "gemm", "dtype": "bf16"}]}))
    r = runner.invoke(app, ["calibrate", str(bad), "--gpu", "h200"])
    assert r.exit_code == 2 and str(bad) in r.output
