"""In-situ speed calibration (llmcap.sim.makespan_fit): recover a known slowdown from a burst's makespan."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.errors import LlmcapError
from llmcap.perf.calibrate import CalibratedFit
from llmcap.perf.model import LinearStepModel
from llmcap.sim import EngineConfig, SimConfig, simulate
from llmcap.sim.makespan_fit import fit_to_makespan, makespan
from llmcap.trace import scale_rate
from tests.sim._workloads import MODEL, random_trace

FIT = CalibratedFit(
    MODEL,
    client_overhead_s=0.004,
    terms_fitted=("overhead",),
    n_observations=1,
    median_abs_rel_error=0.0,
    max_abs_rel_error=0.0,
)
CONFIG = SimConfig(engine=EngineConfig(num_blocks=400, max_num_batched_tokens=256, max_num_seqs=16))


def test_scaled_fit_scales_every_step_time_and_keeps_the_client_overhead() -> None:
    s = FIT.scaled(1.5).scaled(2.0)
    np.testing.assert_allclose(s.model.coefficients, 3.0 * MODEL.coefficients, rtol=1e-15)
    assert s.client_overhead_s == FIT.client_overhead_s and s.extra["speed_factors"] == {"prefill": 3.0, "decode": 3.0}
    with pytest.raises(ValueError):
        FIT.scaled(0.0)


def test_scaled_by_phase_scales_prefill_terms_and_the_rest_apart() -> None:
    model = LinearStepModel(
        overhead_s=1e-3,
        per_prefill_token_s=2e-5,
        per_pair_s=1e-9,
        per_prefill_seq_s=3e-4,
        per_decode_seq_s=5e-5,
        per_context_token_s=1e-8,
    )
    fit = CalibratedFit(
        model,
        client_overhead_s=0.004,
        terms_fitted=LinearStepModel.TERMS,
        n_observations=6,
        median_abs_rel_error=0.0,
        max_abs_rel_error=0.0,
    )
    s = fit.scaled_by_phase(prefill=0.5, decode=2.0).model
    assert (s.per_prefill_token_s, s.per_pair_s, s.per_prefill_seq_s) == pytest.approx((1e-5, 5e-10, 1.5e-4), rel=1e-15)
    assert (s.overhead_s, s.per_decode_seq_s, s.per_context_token_s) == pytest.approx((2e-3, 1e-4, 2e-8), rel=1e-15)
    with pytest.raises(ValueError):
        fit.scaled_by_phase(1.0, float("nan"))


@pytest.mark.parametrize("true_factor", [0.7, 1.3, 2.2])
def test_a_known_slowdown_is_recovered_from_the_burst_makespan(true_factor: float) -> None:
    burst = scale_rate(random_trace(np.random.default_rng(3), 80), 1000.0)  # every request within ~0.1 s
    measured = makespan(simulate(burst, FIT.scaled(true_factor), CONFIG).records)
    scaled, info = fit_to_makespan(burst, FIT, CONFIG, measured)
    assert abs(info.fitted_s / measured - 1) <= 1e-3 and info.iterations <= 12
    assert info.factor == pytest.approx(true_factor, rel=0.01)  # arrivals inside the burst: not exactly proportional
    assert info.unscaled_s == pytest.approx(measured / true_factor, rel=0.05)
    assert scaled.extra["speed_factors"] == {"prefill": info.factor, "decode": info.factor}


def test_bad_measurements_are_refused() -> None:
    burst = scale_rate(random_trace(np.random.default_rng(4), 10), 1000.0)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(LlmcapError, match="measured makespan"):
            fit_to_makespan(burst, FIT, CONFIG, bad)
    unfinished = simulate(burst, MODEL, CONFIG.model_copy(update={"max_time_s": 1e-3})).records
    with pytest.raises(LlmcapError, match="did not finish"):
        makespan(unfinished)
