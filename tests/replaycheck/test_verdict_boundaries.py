"""The step-5 verdict at its edges (llmcap.replaycheck.compare). A scale holds when every run's 95% Wilson
lower bound reaches the target, fails when some run's upper bound is below it, and is inconclusive in
between. The bounds are worked out here by the textbook formula, not by scipy, and checked against it:
for n = 100 and a target of 0.90, 96 met is the fewest that holds, and 84 met is the most that fails."""

from __future__ import annotations

import math

import pytest

from llmcap.replaycheck.compare import judge_runs, verdict, wilson

Z = 1.959963984540054  # the two-sided 95% normal quantile
TARGET = 0.90


def wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    p = k / n
    centre, spread = p + Z * Z / (2 * n), Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return (centre - spread) / (1 + Z * Z / n), (centre + spread) / (1 + Z * Z / n)


@pytest.mark.parametrize(("k", "low", "high"), [(96, 0.90163, 0.98434), (95, 0.88825, 0.97846), (85, 0.76716, 0.90694), (84, 0.75580, 0.89905)])
def test_wilson_bounds_are_the_textbook_ones(k: int, low: float, high: float) -> None:
    assert wilson(k, 100) == pytest.approx(wilson_by_hand(k, 100), abs=1e-9)
    assert wilson(k, 100) == pytest.approx((low, high), abs=1e-5)


@pytest.mark.parametrize(("k", "judged"), [(96, "holds"), (95, "inconclusive"), (85, "inconclusive"), (84, "fails")])
def test_a_scale_is_judged_by_its_bounds(k: int, judged: str) -> None:
    assert judge_runs([(k, 100)], TARGET)[0] == judged


def test_every_run_must_hold_and_any_run_can_fail_a_scale() -> None:
    assert judge_runs([(100, 100), (95, 100)], TARGET)[0] == "inconclusive"  # the least certain run decides
    assert judge_runs([(96, 100), (84, 100)], TARGET)[0] == "fails"
    judged, bounds, n = judge_runs([(100, 100), (84, 100), (80, 100)], TARGET)
    assert judged == "fails" and n == 100 and bounds == pytest.approx(wilson_by_hand(80, 100))  # the worst failing run is shown


@pytest.mark.parametrize(
    ("low_run", "high_run", "outcome"),
    [
        ((96, 100), (84, 100), "confirmed"),  # holds below the predicted rate, fails above it
        ((95, 100), (84, 100), "inconclusive"),  # one request fewer at the low scale: not resolved
        ((96, 100), (85, 100), "inconclusive"),  # one more at the high scale: not resolved either
        ((84, 100), (84, 100), "contradicted"),  # fails below the predicted rate
        ((96, 100), (96, 100), "contradicted"),  # holds above it: the prediction was too low
    ],
)
def test_the_outcome_at_the_edges(low_run: tuple[int, int], high_run: tuple[int, int], outcome: str) -> None:
    v = verdict({0.8: [low_run], 1.2: [high_run]}, TARGET)
    assert v["outcome"] == outcome and v["knee_in_band"] is (outcome == "confirmed")


def test_late_sends_make_any_outcome_invalid() -> None:
    v = verdict({0.8: [(96, 100)], 1.2: [(84, 100)]}, TARGET, invalid=["0.8x seed 0"])
    assert v["outcome"] == "invalid" and v["knee_in_band"] is False and "INVALID runs 0.8x seed 0" in v["text"]
