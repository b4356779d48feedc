"""The repeat-envelope rule: a prediction is asked to be only as close to an engine as the engine is to itself.

An engine on a shared machine does not reproduce its own latency run to run, so a fixed tolerance would
fail a correct model on a noisy day and pass a wrong one on a quiet day. The rule, for one statistic
(e.g. TTFT p50 at one rate) measured in n >= 3 repeats, each repeat i with its own prediction p_i (the
step model scaled in situ by a speed probe taken beside that repeat; a single prediction is broadcast):

- q_i = m_i / p_i, the repeat's measurement relative to its own prediction;
- the repeats *agree* when IQR(q) / median(q) <= tolerance;
- the prediction *passes* when it is within `tolerance` of the median of the repeats
  (|1 / median(q) - 1| <= tolerance), or, when the repeats do not agree, when it lies inside their
  range (min(q) <= 1 <= max(q)). The engine's spread only widens the band, never narrows it.

A prediction can also be a band per repeat, [low_i, high_i] (`judge_band`): the simulator run at the
slowest and the fastest speed the engine was measured at around that repeat, when that speed is known
only to the spread of its measurements. The repeat's prediction p_i is then the point of its band nearest
to what it measured (m_i clipped to the band) and the rule above applies unchanged; a band of width 0 is
the point rule. The band's width is reported beside the verdict: it is how much the check cannot resolve.

It can fail: a prediction 30% off repeats that agree within 10% fails, and so does one outside the
range of repeats however widely they spread, and a band that ends 30% short of such repeats
(tests/reconcile/test_repeatability.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

TOLERANCE = 0.15
MIN_REPEATS = 3


@dataclass(frozen=True)
class EnvelopeVerdict:
    predicted: tuple[float, ...]  # p_i, one per repeat
    measured: tuple[float, ...]  # m_i
    tolerance: float
    band: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # (low_i, high_i) when judged as a band

    @property
    def band_width(self) -> float:
        """Median over repeats of high_i / low_i - 1 (0 for a point prediction)."""
        if self.band is None:
            return 0.0
        return float(np.median(np.asarray(self.band[1]) / np.asarray(self.band[0])) - 1.0)

    @property
    def ratios(self) -> np.ndarray:
        """q_i = m_i / p_i."""
        return np.asarray(self.measured) / np.asarray(self.predicted)

    @property
    def median_ratio(self) -> float:
        return float(np.median(self.ratios))

    @property
    def spread(self) -> float:
        """IQR / median of q: how far the repeats are from each other."""
        q25, q75 = np.percentile(self.ratios, [25, 75])
        return float((q75 - q25) / self.median_ratio)

    @property
    def error(self) -> float:
        """The prediction against the median repeat: predicted / measured - 1."""
        return 1.0 / self.median_ratio - 1.0

    @property
    def agree(self) -> bool:
        return self.spread <= self.tolerance

    @property
    def inside_range(self) -> bool:
        q = self.ratios
        return bool(q.min() <= 1.0 <= q.max())

    @property
    def passed(self) -> bool:
        return abs(self.error) <= self.tolerance or (not self.agree and self.inside_range)

    @property
    def reason(self) -> str:
        q = self.ratios
        what = "prediction" if self.band is None else f"prediction band (width {self.band_width:.0%}), nearest point"
        head = (
            f"{what} {self.error:+.1%} off the median of {q.size} repeats; repeats spread "
            f"{self.spread:.1%} (IQR/median), range of measured/predicted {q.min():.2f}-{q.max():.2f}"
        )
        if abs(self.error) <= self.tolerance:
            return f"{head}: within {self.tolerance:.0%} of the median"
        if self.agree:
            return f"{head}: the repeats agree within {self.tolerance:.0%} and the prediction is outside that"
        if self.inside_range:
            return f"{head}: the repeats disagree by more than {self.tolerance:.0%} and the prediction lies inside their range"
        return f"{head}: the repeats disagree by more than {self.tolerance:.0%} and the prediction lies outside their range"


def _checked(measured: ArrayLike, tolerance: float, **predicted: ArrayLike) -> tuple[np.ndarray, ...]:
    m = np.asarray(measured, dtype=np.float64).ravel()
    if m.size < MIN_REPEATS:
        raise ValueError(f"the repeat-envelope rule needs at least {MIN_REPEATS} repeats, got {m.size}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")
    ps = [np.broadcast_to(np.asarray(v, dtype=np.float64), m.shape).ravel() for v in predicted.values()]
    for name, v in (("measured", m), *zip(predicted, ps, strict=True)):
        if not (np.all(np.isfinite(v)) and np.all(v > 0)):
            raise ValueError(f"{name} must be finite and positive, got {v.tolist()}")
    return (m, *ps)


def judge(predicted: ArrayLike, measured: ArrayLike, tolerance: float = TOLERANCE) -> EnvelopeVerdict:
    """The verdict of the rule for one statistic: `predicted` per repeat (or one value for all), `measured` per repeat."""
    m, p = _checked(measured, tolerance, predicted=predicted)
    return EnvelopeVerdict(tuple(p.tolist()), tuple(m.tolist()), tolerance)


def judge_band(low: ArrayLike, high: ArrayLike, measured: ArrayLike, tolerance: float = TOLERANCE) -> EnvelopeVerdict:
    """The rule for a prediction band per repeat: each repeat's prediction is the point of [low_i, high_i]
    nearest to its measurement."""
    m, lo, hi = _checked(measured, tolerance, low=low, high=high)
    if np.any(lo > hi):
        raise ValueError(f"band low above high: low {lo.tolist()}, high {hi.tolist()}")
    return EnvelopeVerdict(
        tuple(np.clip(m, lo, hi).tolist()), tuple(m.tolist()), tolerance, (tuple(lo.tolist()), tuple(hi.tolist()))
    )


def majority(flags: ArrayLike) -> bool:
    """What most repeats say (a tie counts as False): the engine's own verdict on a yes/no question."""
    f = np.asarray(flags, dtype=bool).ravel()
    if f.size == 0:
        raise ValueError("no repeats")
    return bool(f.sum() * 2 > f.size)
