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
from dataclasses import dataclass


@dataclass
class _Stall:
    start: float  # twin time the engine clock stops
    end: float  # twin time it runs again


class TwinClock:
    def __init__(self, dilation: float = 1.0, slowdown: float = 1.0, wall0: float | None = None) -> None:
        if dilation <= 0 or slowdown <= 0:
            raise ValueError("dilation and slowdown must be > 0")
        self.dilation = dilation
        self.wall0 = time.perf_counter() if wall0 is None else wall0
        self._tau_a = 0.0  # anchor: engine time sigma_a at twin time tau_a, rate 1/slowdown from there
        self._sigma_a = 0.0
        self._slowdown = slowdown
        self._stall: _Stall | None = None

    # ------------------------------------------------------------ conversions

    def tau(self, wall: float | None = None) -> float:
        """Twin time at a wall time (default: now)."""
        return ((time.perf_counter() if wall is None else wall) - self.wall0) / self.dilation

    def wall(self, tau: float) -> float:
        return self.wall0 + tau * self.dilation

    def sigma(self, tau: float | None = None) -> float:
        """Engine time at twin time tau (default: now)."""
        t = self.tau() if tau is None else tau
        self._retire_stall(t)
        run = t - self._tau_a
        if self._stall is not None and t > self._stall.start:
            run -= min(t, self._stall.end) - self._stall.start
        return self._sigma_a + run / self._slowdown

    def tau_of(self, sigma: float) -> float:
        """The twin time at which the engine clock reaches sigma (after the anchor; a stall that
        starts before it pushes it back by the stall's length)."""
        t = self._tau_a + (sigma - self._sigma_a) * self._slowdown
        if self._stall is not None and t > self._stall.start:
            t += self._stall.end - self._stall.start
        return t

    def wall_of(self, sigma: float) -> float:
        return self.wall(self.tau_of(sigma))

    # ------------------------------------------------------------ knobs

    @property
    def slowdown(self) -> float:
        return self._slowdown

    def set_slowdown(self, factor: float, tau: float | None = None) -> None:
        """Engine steps take `factor` x their simulated time from now on."""
        if factor <= 0:
            raise ValueError("slowdown must be > 0")
        self._reanchor(self.tau() if tau is None else tau)
        self._slowdown = factor

    def stall(self, seconds: float, at: float | None = None) -> None:
        """Stop the engine clock for `seconds` of twin time from twin time `at` (default: now); it
        replaces a stall not yet over."""
        if seconds < 0:
            raise ValueError("stall seconds must be >= 0")
        now = self.tau()
        start = now if at is None else max(at, now)
        self._reanchor(now)
        self._stall = _Stall(start, start + seconds)

    def stalled(self, tau: float | None = None) -> bool:
        t = self.tau() if tau is None else tau
        return self._stall is not None and self._stall.start <= t < self._stall.end

    def _reanchor(self, tau: float) -> None:
        sigma = self.sigma(tau)
        stall = self._stall
        if stall is not None and tau < stall.end:  # keep what is left of the stall
            self._stall = _Stall(max(stall.start, tau), stall.end)
        else:
            self._stall = None
        self._tau_a, self._sigma_a = tau, sigma

    def _retire_stall(self, tau: float) -> None:
        stall = self._stall
        if stall is not None and tau >= stall.end:
            self._tau_a, self._sigma_a = stall.end, self._sigma_a + (stall.start - self._tau_a) / self._slowdown
            self._stall = None
