"""Deterministic synthetic evaluate functions (module-level dataclasses: they pickle for process/Dask workers)."""

from __future__ import annotations

from dataclasses import dataclass

from llmcap.sizing.search import EvalResult


@dataclass(frozen=True)
class Knee:
    """Attainment 1 up to `threshold`, then falling linearly to 0 at 2 × threshold; seeds shift the threshold
    by `jitter` × (seed − 1) × threshold (seed 0: −jitter, seed 1: 0, seed 2: +jitter)."""

    threshold: float
    jitter: float = 0.0

    def seed_threshold(self, seed: int) -> float:
        return self.threshold * (1 + self.jitter * (seed - 1))

    def __call__(self, rate: float, seed: int) -> EvalResult:
        t = self.seed_threshold(seed)
        att = 1.0 if rate <= t else max(0.0, 1.0 - (rate - t) / t)
        return EvalResult(att, {"rate": rate, "ttft_p99_ms": 100.0 + rate})


@dataclass(frozen=True)
class Dips:
    """Feasible up to `top`, except inside the open-closed intervals `dips` (a non-monotone A(λ))."""

    top: float
    dips: tuple[tuple[float, float], ...]

    def __call__(self, rate: float, seed: int) -> EvalResult:
        bad = rate > self.top or any(lo < rate <= hi for lo, hi in self.dips)
        return EvalResult(0.0 if bad else 1.0)


@dataclass(frozen=True)
class Overloaded:
    """Attainment always 1 (the run ends before the queue shows), but runs above `threshold` report overload."""

    threshold: float

    def __call__(self, rate: float, seed: int) -> EvalResult:
        return EvalResult(1.0, overload="queue still growing" if rate > self.threshold else "")
