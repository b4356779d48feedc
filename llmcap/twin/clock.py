"""The twin's three clocks: wall time, twin time and engine time.

- wall: `time.perf_counter()` seconds, what HTTP clients see;
- twin time τ = (wall - wall0) / dilation: the simulated deployment's seconds (dilation 10 plays a
  second of the deployment in ten wall seconds, 0.1 in a tenth);
- engine time σ: the simulator's own clock. It runs at 1 / slowdown of twin time, and stands still
  during a stall. A slowdown of X thus makes every engine step (and KV transfer) X times longer in
  twin time while arrivals keep their pace: exactly the simulator with step times x X, without
  touching its step-time model (which keeps the simulator's fast, compiled timing path).

σ(τ) is piecewise linear. A knob change re-anchors it at the current instant, so what the engine
already did stays where it was.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from dataclasses import dataclass


@dataclass(frozen=True)
class _Stall:
    start: float  # twin time the engine clock stops
    end: float  # twin time it runs again


class TwinClock:
    """σ(τ) as breakpoints (τ_k, σ_k, rate_k): from τ_k on, σ = σ_k + (τ - τ_k)·rate_k, rate 0 in a
    stall. The whole history is kept (a few entries per knob change), so an event processed a little
    late still converts to the twin time it belonged to."""

    def __init__(self, dilation: float = 1.0, slowdown: float = 1.0, wall0: float | None = None) -> None:
        if dilation <= 0 or slowdown <= 0:
            raise ValueError("dilation and slowdown must be > 0")
        self.dilation = dilation
        self.wall0 = time.perf_counter() if wall0 is None else wall0
        self._slowdown = slowdown
        self._stall: _Stall | None = None
        self._taus = [0.0]
        self._bp = [(0.0, 0.0, 1.0 / slowdown)]

    # ------------------------------------------------------------ conversions

    def tau(self, wall: float | None = None) -> float:
        """Twin time at a wall time (default: now)."""
        return ((time.perf_counter() if wall is None else wall) - self.wall0) / self.dilation

    def wall(self, tau: float) -> float:
        return self.wall0 + tau * self.dilation

    def sigma(self, tau: float | None = None) -> float:
        """Engine time at twin time tau (default: now)."""
        t = self.tau() if tau is None else tau
        tau_k, sigma_k, rate = self._bp[max(0, bisect_right(self._taus, t) - 1)]
        return sigma_k + (t - tau_k) * rate

    def tau_of(self, sigma: float) -> float:
        """The twin time at which the engine clock reaches sigma (the start of a stall, not its end,
        when it reaches it just as a stall begins)."""
        bp = self._bp
        for k in range(len(bp) - 1, -1, -1):
            tau_k, sigma_k, rate = bp[k]
            if rate > 0 and (sigma > sigma_k or k == 0):
                return tau_k + (sigma - sigma_k) / rate
        return bp[0][0]  # unreachable: the first breakpoint runs

    def wall_of(self, sigma: float) -> float:
        return self.wall(self.tau_of(sigma))

    # ------------------------------------------------------------ knobs

    @property
    def slowdown(self) -> float:
        return self._slowdown

    def set_slowdown(self, factor: float, tau: float | None = None) -> None:
        """Engine steps take `factor` x their simulated time from now (or twin time `tau`) on."""
        if factor <= 0:
            raise ValueError("slowdown must be > 0")
        t = self.tau() if tau is None else tau
        self._slowdown = factor
        self._rebuild(t)

    def stall(self, seconds: float, at: float | None = None, now: float | None = None) -> None:
        """Stop the engine clock for `seconds` of twin time from twin time `at` (default: now); it
        replaces a stall not yet over."""
        if seconds < 0:
            raise ValueError("stall seconds must be >= 0")
        t = self.tau() if now is None else now
        start = t if at is None else max(at, t)
        self._stall = _Stall(start, start + seconds)
        self._rebuild(t)

    def stalled(self, tau: float | None = None) -> bool:
        t = self.tau() if tau is None else tau
        return self._stall is not None and self._stall.start <= t < self._stall.end

    def _rebuild(self, t: float) -> None:
        """Keep the past before t; from t on, the current slowdown and the pending stall."""
        sigma = self.sigma(t)
        rate = 1.0 / self._slowdown
        bp = [b for b in self._bp if b[0] < t]
        st = self._stall
        if st is not None and st.end > t:
            start = max(st.start, t)
            if start > t:
                bp.append((t, sigma, rate))
                sigma += (start - t) * rate
            bp += [(start, sigma, 0.0), (st.end, sigma, rate)]
        else:
            bp.append((t, sigma, rate))
        self._bp = bp
        self._taus = [b[0] for b in bp]
