"""Seeded arrival processes: Poisson or gamma renewal, or a two-state Markov-modulated Poisson process (bursts),
with optional diurnal modulation."""

from __future__ import annotations

import numpy as np

from llmcap.trace.params import ArrivalSpec


def generate_arrivals(n: int, spec: ArrivalSpec, rng: np.random.Generator) -> np.ndarray:
    """`n` arrival times in seconds, starting at 0, with mean rate `spec.rate_rps`.

    Gamma gaps with shape 1/cv² keep the mean and set the burstiness (cv = 1 is Poisson). A diurnal
    swing is applied by time-rescaling: the process is generated on a unit-rate clock and mapped
    through the inverse of the cumulative intensity Λ(t) = r·(t + A·P/2π·(1 − cos 2πt/P)), which keeps
    the renewal structure locally and the long-run mean rate exactly r.
    """
    if n <= 0:
        return np.zeros(0, dtype=np.float64)
    if spec.process == "mmpp":
        unit_clock = _mmpp_unit_clock(n, spec, rng)
        return (
            unit_clock / spec.rate_rps
            if spec.diurnal_amplitude == 0.0
            else _invert_cumulative_intensity(unit_clock, spec)
        )
    if spec.process == "poisson":
        gaps = rng.exponential(1.0, size=n - 1)
    else:
        shape = 1.0 / spec.cv**2
        gaps = rng.gamma(shape, 1.0 / shape, size=n - 1)
    unit_clock = np.concatenate(([0.0], np.cumsum(gaps)))  # mean gap 1 → Λ units
    if spec.diurnal_amplitude == 0.0:
        return unit_clock / spec.rate_rps
    return _invert_cumulative_intensity(unit_clock, spec)


def _invert_cumulative_intensity(lam: np.ndarray, spec: ArrivalSpec) -> np.ndarray:
    rate, amp, period = spec.rate_rps, spec.diurnal_amplitude, spec.diurnal_period_s
    horizon = lam[-1] / (rate * (1.0 - amp)) + period  # Λ grows at least at r(1-A): t_max bounds the answer
    grid = np.linspace(0.0, horizon, max(4_096, int(64 * horizon / period) + 1))
    cumulative = rate * (grid + amp * period / (2 * np.pi) * (1.0 - np.cos(2 * np.pi * grid / period)))
    return np.interp(lam, cumulative, grid)


def _mmpp_unit_clock(n: int, spec: ArrivalSpec, rng: np.random.Generator) -> np.ndarray:
    """`n` arrivals of a two-state MMPP on a unit-rate clock (mean gap 1), starting at 0.

    The process alternates calm and burst periods with exponential lengths (bursts of mean `burst_s` in rate
    units, calm periods long enough that bursts take `burst_share` of the time); within each period arrivals
    are Poisson at the state's rate, the burst's `burst_factor` times the calm one, scaled so the long-run
    rate is 1. Drawn period by period in vectorised batches until `n` arrivals exist.
    """
    share, factor = spec.burst_share, spec.burst_factor
    calm_rate = 1.0 / ((1.0 - share) + factor * share)
    burst_len = spec.burst_s * spec.rate_rps  # seconds → unit-clock time
    calm_len = burst_len * (1.0 - share) / share
    starts: list[np.ndarray] = []
    t, found = 0.0, 0
    batch = max(16, int(2 * n * burst_len / max(1.0, factor * calm_rate * burst_len)) + 16)
    while found < n:
        calm, burst = rng.exponential(calm_len, batch), rng.exponential(burst_len, batch)
        lengths = np.column_stack((calm, burst)).ravel()  # calm, burst, calm, burst, ...
        rates = np.tile([calm_rate, factor * calm_rate], batch)
        begins = t + np.concatenate(([0.0], np.cumsum(lengths)[:-1]))
        counts = rng.poisson(rates * lengths)
        times = np.repeat(begins, counts) + rng.random(int(counts.sum())) * np.repeat(lengths, counts)
        starts.append(np.sort(times))
        t, found = t + float(lengths.sum()), found + times.size
    clock = np.concatenate(starts)[:n]
    return clock - clock[0]
