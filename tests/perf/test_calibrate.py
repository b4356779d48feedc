"""NNLS calibration of the LinearStepModel from TTFT and decode-gap observations."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.perf import LinearStepModel, decode_step_time, prefill_time
from llmcap.perf.calibrate import (
    CalibratedFit,
    StepObservations,
    decode_observations,
    fit_step_model,
    prefill_observations,
)

TRUE = LinearStepModel(
    overhead_s=2e-3, per_prefill_token_s=20e-6, per_pair_s=8e-9, per_decode_seq_s=150e-6, per_context_token_s=40e-9
)
CLIENT = 5e-3
CHUNK = 2048


def _observations(model: LinearStepModel, noise: float = 0.0, seed: int = 0) -> StepObservations:
    rng = np.random.default_rng(seed)
    isl = np.array([64, 256, 1024, 2048, 4096])
    ttft = CLIENT + prefill_time(model, isl, chunk=CHUNK)
    c, ctx = np.meshgrid([1, 4, 16], [100.0, 1100.0, 2100.0])
    gap = decode_step_time(model, c.ravel(), ctx.ravel())
    y_p = ttft * (1 + noise * rng.standard_normal(ttft.size))
    y_d = gap * (1 + noise * rng.standard_normal(gap.size))
    return StepObservations.concat(
        [prefill_observations(isl, y_p, chunk=CHUNK), decode_observations(c.ravel(), ctx.ravel(), y_d)]
    )


def test_prefill_observation_sums_the_chunks_like_prefill_time() -> None:
    obs = prefill_observations([1000, 5000], [0.1, 0.5], chunk=CHUNK)
    # 5000 tokens in chunks of 2048: 3 steps; the pairs are those of each chunk after its context
    assert obs.steps.tolist() == [1.0, 3.0]
    assert obs.prefill_tokens.tolist() == [1000.0, 5000.0]
    assert obs.client.tolist() == [1.0, 1.0]
    expected = sum(n * c + n * (n + 1) / 2 for n, c in ((2048, 0), (2048, 2048), (904, 4096)))
    assert obs.prefill_pairs[1] == expected
    t = CalibratedFit(TRUE, CLIENT, (), 0, 0.0, 0.0).predict(obs)
    assert t == pytest.approx(CLIENT + prefill_time(TRUE, [1000, 5000], chunk=CHUNK))


def test_exact_observations_recover_the_model() -> None:
    fit = fit_step_model(_observations(TRUE))
    assert fit.model.coefficients == pytest.approx(TRUE.coefficients, rel=1e-6, abs=1e-15)
    assert fit.client_overhead_s == pytest.approx(CLIENT, rel=1e-6)
    assert fit.max_abs_rel_error < 1e-9


def test_a_collinear_term_is_left_at_zero() -> None:
    # unchunked single-request prefills: prefill_seqs (1 per TTFT) is the client column again
    isl = np.array([64.0, 256.0, 1024.0, 2048.0])
    obs = StepObservations.concat(
        [
            prefill_observations(isl, CLIENT + prefill_time(TRUE, isl)),
            decode_observations(
                [1, 4, 16], [500.0, 500.0, 900.0], decode_step_time(TRUE, [1, 4, 16], [500.0, 500.0, 900.0])
            ),
        ]
    )
    fit = fit_step_model(obs)
    assert "prefill_seqs" not in fit.terms_fitted and fit.model.per_prefill_seq_s == 0.0
    assert fit.client_overhead_s == pytest.approx(CLIENT, rel=1e-6)


def test_noisy_observations_predict_within_the_noise() -> None:
    fit = fit_step_model(_observations(TRUE, noise=0.05, seed=3))
    assert np.all(fit.model.coefficients >= 0)
    isl = np.array([128, 512, 1536, 3000])
    truth = CLIENT + prefill_time(TRUE, isl, chunk=CHUNK)
    assert np.abs(fit.ttft(isl, chunk=CHUNK) / truth - 1).max() < 0.10
    truth_itl = decode_step_time(TRUE, [2, 8], [600.0, 1600.0])
    assert np.abs(fit.mean_itl([2, 8], [568.0, 1568.0], [64, 64]) / truth_itl - 1).max() < 0.10


def test_round_trips_through_a_dict() -> None:
    fit = fit_step_model(_observations(TRUE, noise=0.02))
    again = CalibratedFit.from_dict(fit.to_dict())
    assert again == fit


def test_rejects_unusable_measurements() -> None:
    with pytest.raises(ValueError, match="finite and > 0"):
        fit_step_model(decode_observations([1, 2], [10.0, 10.0], [0.01, 0.0]))
    with pytest.raises(ValueError, match="no observations"):
        fit_step_model(StepObservations.concat([decode_observations([], [], [])]))
