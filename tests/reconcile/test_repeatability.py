"""The repeat-envelope rule (llmcap.reconcile.repeatability) on hand-made repeats."""

import numpy as np
import pytest

from llmcap.reconcile.repeatability import judge, majority


def test_fails_a_prediction_30_percent_off_repeats_that_agree_within_10_percent():
    measured = [1.00, 1.03, 0.97, 1.05, 0.99]  # IQR/median 4%, all within 10% of each other
    v = judge(1.30, measured)
    assert v.agree and v.spread < 0.10
    assert v.error == pytest.approx(1.30 / np.median(measured) - 1)
    assert not v.passed
    assert "outside" in v.reason


def test_passes_within_tolerance_of_the_median():
    v = judge(1.12, [1.00, 1.03, 0.97, 1.05, 0.99])
    assert v.passed and abs(v.error) <= 0.15


def test_scattered_repeats_widen_the_band_to_their_range():
    measured = [1.0, 1.6, 2.2, 2.9, 3.4]  # IQR/median 59%
    inside = judge(1.2, measured)  # 45% below the median, inside the range
    assert not inside.agree and inside.passed
    outside = judge(0.8, measured)  # below every repeat
    assert not outside.passed


def test_per_repeat_predictions_normalise_each_repeat():
    # each repeat ran at its own speed and its prediction was scaled by that repeat's probe: the
    # measured/predicted ratios agree although the raw measurements spread 2x
    predicted = np.array([1.0, 1.5, 2.0, 1.2, 1.8])
    v = judge(predicted, predicted * 1.05)
    assert v.spread == pytest.approx(0.0, abs=1e-12) and v.passed
    off = judge(predicted, predicted * 1.4)
    assert off.agree and not off.passed


def test_the_band_never_narrows_below_the_tolerance():
    # the prediction is 10% off the median; the repeats spread wide but all lie on one side of it
    v = judge(1.0, [1.01, 1.02, 1.1, 1.4, 1.5])
    assert not v.agree and not v.inside_range and v.passed


@pytest.mark.parametrize("measured", [[1.0, 1.1], [1.0, 0.0, 1.0], [1.0, float("nan"), 1.0]])
def test_rejects_too_few_or_bad_repeats(measured):
    with pytest.raises(ValueError):
        judge(1.0, measured)


def test_majority():
    assert majority([True, True, False]) and not majority([True, False]) and not majority([False] * 3)
