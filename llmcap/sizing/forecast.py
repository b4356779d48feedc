"""The autoscaler's rate forecast, fitted from the trace where it spans enough time.

A forecast is a curve λ̂(t) and a relative error e: the floor plans for λ̂(t) · (1 + e). Fitted here:

- seasonality: a harmonic regression of the trace's binned arrival rate, λ̂(t) = c + Σ_P Σ_k=1..K (a_Pk cos 2πkt/P +
  b_Pk sin 2πkt/P), with P = one day, and one week too where the trace spans ≥ 2 weeks; a trace shorter than
  2 days has no daily cycle to fit (`SeasonalFit.fitted` is None and `reason` says so);
- the error from history: fitted on the first (1 − holdout) of the span, e = the `quantile` of actual ÷ λ̂ − 1 over the
  held-back final bins (not below 0): how far above its forecast the rate went where the fit had not seen it.

The flat forecast beside it (the fit part's mean rate, its error measured the same way) is what a floor without
seasonality would plan for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

DAY_S = 86_400.0
WEEK_S = 7 * DAY_S
MIN_RATE = 1e-9  # a fitted curve may dip below 0 where the trace is idle; a rate never does


@dataclass(frozen=True)
class Harmonic:
    """λ(t) = coef · [1, cos 2πkt'/P, sin 2πkt'/P for P in periods, k = 1..harmonics], t' = t + offset_s."""

    coef: tuple[float, ...]
    periods_s: tuple[float, ...] = ()
    harmonics: int = 0
    offset_s: float = 0.0

    def rate_at(self, t: ArrayLike) -> np.ndarray:
        x = design(np.asarray(t, dtype=np.float64) + self.offset_s, self.periods_s, self.harmonics)
        return np.maximum(x @ np.asarray(self.coef), MIN_RATE)

    def shifted(self, offset_s: float) -> Harmonic:
        return Harmonic(self.coef, self.periods_s, self.harmonics, offset_s)


def design(t: np.ndarray, periods_s: tuple[float, ...], harmonics: int) -> np.ndarray:
    cols = [np.ones_like(t)]
    for p in periods_s:
        for k in range(1, harmonics + 1):
            w = 2.0 * np.pi * k * t / p
            cols += [np.cos(w), np.sin(w)]
    return np.stack(cols, axis=-1)


@dataclass(frozen=True)
class Forecast:
    """What the floor plans for: `curve.rate_at(t)` × (1 + error). kind: synthetic (the what-if day's own curve, error
    assumed), fitted (seasonality from the trace, error from its held-back part) or flat (no seasonality)."""

    kind: str
    curve: object  # anything with rate_at(t) -> ndarray
    error: float
    description: str

    def rate_at(self, t: ArrayLike) -> np.ndarray:
        return np.asarray(self.curve.rate_at(t), dtype=np.float64)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class SeasonalFit:
    span_s: float
    reason: str  # what was fitted, or why nothing was
    fitted: Forecast | None = None  # curves in the trace's own time (t = 0: its first arrival)
    flat: Forecast | None = None
    holdout_start_s: float = 0.0  # the held-back part starts here (trace time, from its first arrival)
    bin_s: float = 0.0
    holdout_rmse: tuple[float, float] | None = None  # (fitted, flat) over the held-back bins, req/s

    def to_dict(self) -> dict:
        out: dict = {"fitted": self.fitted is not None, "span_h": self.span_s / 3600.0, "reason": self.reason}
        if self.fitted is not None and self.flat is not None and self.holdout_rmse is not None:
            out |= {
                "error": self.fitted.error,
                "flat_error": self.flat.error,
                "holdout_start_s": self.holdout_start_s,
                "bin_s": self.bin_s,
                "holdout_rmse_rps": {"fitted": self.holdout_rmse[0], "flat": self.holdout_rmse[1]},
            }
        return out


def fit_seasonality(
    arrival_s: ArrayLike,
    bin_s: float = 900.0,
    holdout: float = 0.2,
    harmonics: int = 3,
    quantile: float = 0.95,
    min_days: float = 2.0,
) -> SeasonalFit:
    """Daily (and, over ≥ 2 weeks, weekly) seasonality of the arrival rate, and the forecast error on the held-back
    final `holdout` of the span (module docstring)."""
    a = np.sort(np.asarray(arrival_s, dtype=np.float64))
    span = float(a[-1] - a[0]) if a.size > 1 else 0.0
    if span < min_days * DAY_S:
        return SeasonalFit(
            span,
            f"the trace spans {span / 3600:.3g} h: a daily cycle needs at least {min_days:g} days of arrivals to fit "
            "and to hold part back, so the floor keeps the synthesized diurnal curve × (1 + forecast_error)",
        )
    periods = (DAY_S, WEEK_S) if span >= 2 * WEEK_S else (DAY_S,)
    n = int(span // bin_s)
    counts, edges = np.histogram(a - a[0], bins=n, range=(0.0, n * bin_s))
    rate, mid = counts / bin_s, 0.5 * (edges[:-1] + edges[1:])
    cut = int(round(n * (1.0 - holdout)))
    coef, *_ = np.linalg.lstsq(design(mid[:cut], periods, harmonics), rate[:cut], rcond=None)
    curve = Harmonic(tuple(float(c) for c in coef), periods, harmonics)
    flat = Harmonic((float(rate[:cut].mean()),))
    actual = rate[cut:]
    errors, rmse = [], []
    for c in (curve, flat):
        pred = c.rate_at(mid[cut:])
        errors.append(max(0.0, float(np.quantile(actual / pred - 1.0, quantile))))
        rmse.append(float(np.sqrt(np.mean((actual - pred) ** 2))))
    names = " and weekly" if len(periods) > 1 else ""
    where = f"fitted on the first {1 - holdout:.0%} of {span / DAY_S:.3g} days in {bin_s:g} s bins; error = P{quantile * 100:g} of actual ÷ forecast − 1 on the held-back {holdout:.0%}"
    return SeasonalFit(
        span,
        f"daily{names} seasonality ({harmonics} harmonics each) {where}",
        Forecast(
            "fitted",
            curve,
            errors[0],
            f"daily{names} harmonics fitted on the trace, error {errors[0]:.3g} from the held-back part",
        ),
        Forecast(
            "flat",
            flat,
            errors[1],
            f"flat at the fit part's mean {flat.coef[0]:.4g} req/s, error {errors[1]:.3g} from the held-back part",
        ),
        float(edges[cut]),
        bin_s,
        (rmse[0], rmse[1]),
    )
