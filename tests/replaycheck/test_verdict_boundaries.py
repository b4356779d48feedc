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


def wilson_by_hand(k: int, n: int, z: float = Z) -> tuple[float, float]:
    p = k / n
    centre, spread = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n), (centre + spread) / (1 + z * z / n)


@pytest.mark.parametrize(
    ("k", "low", "high"),
    [(96, 0.90163, 0.98434), (95, 0.88825, 0.97846), (85, 0.76716, 0.90694), (84, 0.75580, 0.89905)],
)
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
    assert (
        judged == "fails" and n == 100 and bounds == pytest.approx(wilson_by_hand(80, 100))
    )  # the worst failing run is shown


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


def test_wilson_bounds_of_tiny_samples_and_other_confidences() -> None:
    assert wilson(0, 0) == (0.0, 1.0)  # nothing judged: anything is possible
    # one request, met: p = 1, so the spread is z²/2 and the bounds are (1 + z²/2 ∓ z²/2) / (1 + z²): 1/(1 + z²) and 1
    assert wilson(1, 1) == pytest.approx((1 / (1 + Z * Z), 1.0), abs=1e-9) and wilson(1, 1)[0] == pytest.approx(
        0.20655, abs=1e-5
    )
    z99 = 2.5758293035489004  # the two-sided 99% normal quantile: a wider interval than at 95%
    assert wilson(96, 100, 0.99) == pytest.approx(wilson_by_hand(96, 100, z99), abs=1e-9)
    assert wilson(96, 100, 0.99) == pytest.approx((0.87474, 0.98802), abs=1e-5)


def test_a_bound_exactly_on_the_target_counts_as_reaching_it() -> None:
    # all 100 met: the upper bound is exactly 1.0 (p = 1 above), which does not fall below a target of 1.0, so the
    # scale does not fail; its lower bound (0.96) does not reach 1.0 either: inconclusive
    assert judge_runs([(100, 100)], 1.0)[0] == "inconclusive"
    # none of 10 met: the lower bound is exactly 0.0, which reaches a target of 0.0: holds
    assert judge_runs([(0, 10)], 0.0)[0] == "holds"


def test_the_run_shown_is_the_worst_failing_or_the_least_certain() -> None:
    # both fail 0.90: 7 of 10 has bounds (0.397, 0.892), 80 of 100 (0.711, 0.867). The lower upper bound is the worse
    # failure, though 7 of 10 has the lower lower bound
    judged, bounds, n = judge_runs([(7, 10), (80, 100)], TARGET)
    assert (judged, n) == ("fails", 100) and bounds == pytest.approx(wilson_by_hand(80, 100))
    # neither fails 0.2 (upper bounds 1.0 and 0.278) and both lower bounds are 0: the run with nothing judged is the
    # least certain one, and it is the one shown
    assert judge_runs([(0, 0), (0, 10)], 0.2) == ("inconclusive", (0.0, 1.0), 0)


CONFIRMED_TEXT = (
    "confirmed: holds at 0.8x (95% bounds 0.902–0.984 on 100 requests), "
    "fails at 1.2x (95% bounds 0.756–0.899 on 100 requests) (knee within [0.8, 1.2]x the predicted rate)"
)


def test_the_verdict_document_over_three_scales() -> None:
    # holds at 0.8x and 1x (96 of 100: lower bound 0.902 >= 0.90), fails at 1.2x (84 of 100: upper bound 0.899 < 0.90)
    v = verdict({1.2: [(84, 100)], 0.8: [(96, 100)], 1.0: [(96, 100)]}, TARGET)
    b96, b84 = wilson_by_hand(96, 100), wilson_by_hand(84, 100)
    assert v == {
        "outcome": "confirmed",
        "holds_at_low": True,
        "fails_at_high": True,
        "band": [0.8, 1.2],
        "knee_scale": 1.0,
        "knee_in_band": True,
        "holds": {"0.8x": True, "1x": True, "1.2x": False},
        "judgement": {"0.8x": "holds", "1x": "holds", "1.2x": "fails"},
        "bounds": {"0.8x": pytest.approx(list(b96)), "1x": pytest.approx(list(b96)), "1.2x": pytest.approx(list(b84))},
        "confidence": 0.95,
        "invalid_runs": [],
        "text": CONFIRMED_TEXT,
    }


def test_the_verdict_text_names_the_knee_only_when_confirmed() -> None:
    v = verdict({0.8: [(95, 100)], 1.2: [(84, 100)]}, TARGET)
    assert v["text"] == (
        "inconclusive: inconclusive at 0.8x (95% bounds 0.888–0.978 on 100 requests: too few to resolve 0.9), "
        "fails at 1.2x (95% bounds 0.756–0.899 on 100 requests)"
    )
    late = verdict({0.8: [(96, 100)], 1.2: [(84, 100)]}, TARGET, invalid=["0.8x seed 0", "1.2x seed 1"])
    assert late["text"] == CONFIRMED_TEXT + (
        "; INVALID runs 0.8x seed 0, 1.2x seed 1 (sends ran late past replay.max_lateness_ms: "
        "the client's latency, not the server's)"
    )
    assert late["invalid_runs"] == ["0.8x seed 0", "1.2x seed 1"] and late["outcome"] == "invalid"
