"""The repeat-envelope rule (llmcap.reconcile.repeatability) on hand-made repeats."""

import numpy as np
import pytest

from llmcap.reconcile.repeatability import judge, judge_band, majority


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


def test_a_band_is_judged_at_its_point_nearest_each_repeat():
    measured = [1.00, 1.03, 0.97, 1.05, 0.99]
    inside = judge_band(0.9, 1.2, measured)  # every repeat inside the band
    assert inside.passed and inside.error == pytest.approx(0.0) and inside.band_width == pytest.approx(1.2 / 0.9 - 1)
    assert "band" in inside.reason


def test_a_band_that_ends_30_percent_short_of_agreeing_repeats_fails():
    measured = [1.00, 1.03, 0.97, 1.05, 0.99]
    for low, high in ((1.3, 1.8), (0.4, 0.7)):
        v = judge_band(low, high, measured)
        assert v.agree and not v.passed and abs(v.error) >= 0.29, (low, high, v.reason)


def test_a_band_of_width_zero_is_the_point_rule():
    predicted = np.array([1.0, 1.5, 2.0, 1.2, 1.8])
    measured = predicted * np.array([1.4, 1.3, 1.5, 1.35, 1.45])
    point, band = judge(predicted, measured), judge_band(predicted, predicted, measured)
    assert (band.predicted, band.error, band.passed, band.band_width) == (
        point.predicted,
        point.error,
        point.passed,
        0.0,
    )


def test_a_band_upside_down_is_refused():
    with pytest.raises(ValueError, match="low above high"):
        judge_band(1.2, 1.0, [1.0, 1.0, 1.0])
